// SPDX-License-Identifier: Apache-2.0

package confkeys

import (
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func TestFromStructAndDiff(t *testing.T) {
	type inner struct {
		A string `json:"a"`
	}
	type conf struct {
		types.PluginConf
		inner
		Bridge string `json:"bridge,omitempty"`
		Skip   string `json:"-"`
		hidden string
	}
	got := FromStruct(conf{})
	for _, k := range []string{"cniVersion", "ipam", "a", "bridge"} {
		if !slices.Contains(got, k) {
			t.Errorf("FromStruct lacks %q: %v", k, got)
		}
	}
	if slices.Contains(got, "Skip") || slices.Contains(got, "hidden") {
		t.Errorf("FromStruct has ignored fields: %v", got)
	}
	if d := Diff("bandwidth", conf{}); !strings.Contains(d, "update pkg/confkeys") {
		t.Errorf("Diff of a struct that is not bandwidth's = %q", d)
	}
	if keys, ok := Known("bridge"); !ok || !slices.Contains(keys, "isGateway") || !slices.Contains(keys, "logFile") {
		t.Errorf("Known(bridge) = %v %v", keys, ok)
	}
	if len(IPAM) == 0 || !slices.Contains(IPAM, "ranges") || !slices.Contains(Range, "rangeStart") {
		t.Errorf("IPAM %v, Range %v", IPAM, Range)
	}
}
