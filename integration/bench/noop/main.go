// SPDX-License-Identifier: Apache-2.0

// Command noop is the benchmark floor: the smallest Go CNI plugin, built on skel alone
// (not on podwire's plumbing, so our plumbing's cost shows in our numbers). Chained, it
// passes prevResult through; first in a chain it returns the result given in its
// config's "result" key, or an empty one. It never executes another plugin: linked
// under the conflist's plugin names, a chain of it starts one process per plugin in
// the conflist, which is what the runtime itself pays (libcni executes each plugin
// once). Its ADD/DEL time is that cost, which no real plugin can beat.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

type conf struct {
	types.PluginConf
	Result json.RawMessage `json:"result"`
}

func add(args *skel.CmdArgs) error {
	var c conf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return fmt.Errorf("parsing config: %w", err)
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return err
	}
	res := c.PrevResult
	if res == nil && len(c.Result) > 0 {
		r, err := current.NewResult(c.Result)
		if err != nil {
			return err
		}
		res = r
	}
	if res == nil {
		res = &current.Result{CNIVersion: current.ImplementedSpecVersion}
	}
	return types.PrintResult(res, c.CNIVersion)
}

func none(*skel.CmdArgs) error { return nil }

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: none, Check: none, GC: none, Status: none},
		version.All, "noop CNI plugin (benchmark floor)")
}
