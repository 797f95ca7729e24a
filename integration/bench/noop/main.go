// Command noop is the benchmark floor: the smallest Go CNI plugin, built on skel alone
// (not on podwire's plumbing, so our plumbing's cost shows in our numbers). Chained, it
// passes prevResult through; first in a chain it returns the result given in its
// config's "result" key, or an empty one. Its ADD/DEL time is the cost of starting a Go
// process, which no real plugin can beat.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/containernetworking/cni/pkg/invoke"
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
	// Standing in for a main plugin, start the IPAM process it would start, so the
	// floor has the same number of process starts as the chain it is compared with.
	if res == nil && delegates(&c) {
		os.Setenv(delegatedEnv, "1") // the delegate is noop too: it must not recurse
		r, err := invoke.DelegateAdd(context.Background(), c.IPAM.Type, args.StdinData, nil)
		if err != nil {
			return err
		}
		res = r
	}
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

func del(args *skel.CmdArgs) error {
	var c conf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return fmt.Errorf("parsing config: %w", err)
	}
	if delegates(&c) {
		os.Setenv(delegatedEnv, "1")
		return invoke.DelegateDel(context.Background(), c.IPAM.Type, args.StdinData, nil)
	}
	return nil
}

// delegates reports whether this call stands in for a main plugin with an IPAM
// plugin: not when it is itself the delegate, and not when it stands in for the IPAM
// plugin run on its own (host-local as the chain's only plugin reads its own "ipam").
func delegates(c *conf) bool {
	return c.IPAM.Type != "" && c.IPAM.Type != c.Type && os.Getenv(delegatedEnv) == ""
}

const delegatedEnv = "PODWIRE_NOOP_DELEGATED"

func none(*skel.CmdArgs) error { return nil }

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: add, Del: del, Check: none, GC: none, Status: none},
		version.All, "noop CNI plugin (benchmark floor)")
}
