// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"github.com/containernetworking/plugins/pkg/netlinksafe"
)

// BridgeLinks returns Links for HostCounter: the veths enslaved to bridge and every IFB
// on the host (bandwidth's ingress shaping devices), keyed by name.
func BridgeLinks(bridge string) func() (map[string]map[string]bool, error) {
	return func() (map[string]map[string]bool, error) {
		links, err := netlinksafe.LinkList()
		if err != nil {
			return nil, err
		}
		br := -1
		for _, l := range links {
			if l.Attrs().Name == bridge {
				br = l.Attrs().Index
			}
		}
		out := map[string]map[string]bool{"veth": {}, "ifb": {}}
		for _, l := range links {
			switch l.Type() {
			case "veth":
				if br > 0 && l.Attrs().MasterIndex == br {
					out["veth"][l.Attrs().Name] = true
				}
			case "ifb":
				out["ifb"][l.Attrs().Name] = true
			}
		}
		return out, nil
	}
}
