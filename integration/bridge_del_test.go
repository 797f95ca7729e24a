// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/integration/nstest"
)

// TestBridgeDelBestEffort: a conflist edited after ADD so that it no longer validates
// must not keep DEL from removing the pod's veth, rules and lease. DEL parses only
// what teardown needs (as the reference's DEL does, which succeeds in each case) and
// reports the rest on stderr.
func TestBridgeDelBestEffort(t *testing.T) {
	for _, tc := range []struct{ name, extra string }{
		{"ipMasqBackend typo", `"ipMasqBackend":"nftabels"`},
		{"mtu out of range", `"mtu":-5`},
		{"bridge name too long", `"bridge":"@PREFIX@br-much-too-long"`},
		{"hairpinMode with promiscMode", `"hairpinMode":true,"promiscMode":true`},
		{"relative dataDir", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := nstest.New(t)
			good := `{"cniVersion":"1.1.0","name":"@PREFIX@net","plugins":[
			 {"type":"bridge","bridge":"@PREFIX@br","isGateway":true,"ipMasq":true,"macspoofchk":true%s,
			  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.33.0.0/24"}]],"dataDir":%q}}]}`
			list := h.Conflist(fmtConf(good, "", h.DataDir))
			warmUp(t, h, list)
			before := h.Snapshot()

			p := h.NewPod()
			rt := h.RT(p, "eth0")
			r := h.MustAdd(list, rt)
			hostVeth := r.Interfaces[1].Name
			extra, dataDir := "", h.DataDir
			if tc.extra != "" {
				extra = "," + tc.extra
			} else {
				wd, err := os.Getwd()
				if err != nil {
					t.Fatal(err)
				}
				// The plugins run in this process's working directory (libcni sets none).
				if dataDir, err = filepath.Rel(wd, h.DataDir); err != nil || filepath.IsAbs(dataDir) {
					t.Fatalf("no relative path from %s to %s: %v", wd, h.DataDir, err)
				}
			}
			broken := h.Conflist(fmtConf(good, extra, dataDir))
			if err := h.Del(broken, rt); err != nil {
				t.Fatalf("DEL with the edited conflist: %v", err)
			}
			if out, err := nstest.RunIn(h.HostNS, "ip", "link", "show", hostVeth); err == nil {
				t.Errorf("host veth %s survived DEL:\n%s", hostVeth, out)
			}
			if err := h.Del(broken, rt); err != nil {
				t.Errorf("repeated DEL with the edited conflist: %v", err)
			}
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)
		})
	}
}

func fmtConf(format, extra, dataDir string) string {
	return strings.Replace(strings.Replace(format, "%s", extra, 1), "%q", `"`+dataDir+`"`, 1)
}

// TestBridgeDelNetnsNotMounted: CNI_NETNS names a file that is no longer a mounted
// network namespace (the runtime unmounted it, but a process still holds the
// namespace, so the pod and its veth live on). DEL succeeds and removes the host side:
// the veth (and with it the pod's end), the rules and the lease; so does a repeated DEL.
func TestBridgeDelNetnsNotMounted(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			h := nstest.New(t)
			list := bridgeConf(h, `"isGateway":true,"ipMasq":true,"macspoofchk":true,"ipMasqBackend":"`+backend+`"`, `[[{"subnet":"10.34.0.0/24"}]]`)
			warmUp(t, h, list)
			before := h.Snapshot()

			p := h.NewPod() // p keeps the namespace open
			rt := h.RT(p, "eth0")
			r := h.MustAdd(list, rt)
			if err := unix.Unmount(p.Path(), unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close(); os.Remove(p.Path()) })
			if err := h.Del(list, rt); err != nil {
				t.Fatalf("DEL with CNI_NETNS no longer a netns: %v", err)
			}
			if out, err := nstest.RunIn(h.HostNS, "ip", "link", "show", r.Interfaces[1].Name); err == nil {
				t.Errorf("host veth survived DEL:\n%s", out)
			}
			if err := h.Del(list, rt); err != nil {
				t.Errorf("repeated DEL: %v", err)
			}
			// And a path that never was a namespace.
			plain := filepath.Join(t.TempDir(), "not-a-netns")
			if err := os.WriteFile(plain, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			rt.NetNS = plain
			if err := h.Del(list, rt); err != nil {
				t.Errorf("DEL with CNI_NETNS a plain file: %v", err)
			}
			settleBridge(t, h, h.Name("br"))
			h.RequireUnchanged(before)
		})
	}
}
