// SPDX-License-Identifier: Apache-2.0

package cri

import (
	"strings"
	"testing"
)

// cniconfig is containerd's "cniconfig" Status info as `crictl info` prints it (go-cni's
// ConfigResult, untagged Go field names), shortened: its loopback network and the conflist
// it loaded.
const cniconfig = `{"PluginDirs":["/opt/cni/bin"],"PluginConfDir":"/etc/cni/net.d","PluginMaxConfNum":1,"Prefix":"eth",
"Networks":[
 {"Config":{"Name":"cni-loopback","CNIVersion":"0.3.1","Plugins":[{"Network":{"type":"loopback","ipam":{},"dns":{}},"Source":"{\"type\":\"loopback\"}"}],
  "Source":"{\n\"cniVersion\": \"0.3.1\",\n\"name\": \"cni-loopback\",\n\"plugins\": [{\n  \"type\": \"loopback\"\n}]\n}"},"IFName":"lo"},
 {"Config":{"Name":"podwire","CNIVersion":"1.1.0","Plugins":[{"Network":{"type":"bridge","ipam":{},"dns":{}},"Source":"{\"type\":\"bridge\"}"}],
  "Source":"{\"cniVersion\":\"1.1.0\",\"name\":\"podwire\",\"plugins\":[{\"type\":\"bridge\"}]}"},"IFName":"eth0"},
 {"Config":null,"IFName":"eth1"}
]}`

func TestParseCNIConfig(t *testing.T) {
	ns, err := ParseCNIConfig(cniconfig)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 2 || ns[0].Name != "cni-loopback" || ns[0].IfName != "lo" || ns[1].Name != "podwire" || ns[1].IfName != "eth0" {
		t.Fatalf("networks %+v", ns)
	}
	if !strings.Contains(string(ns[0].Conflist), `"name": "cni-loopback"`) {
		t.Errorf("loopback conflist %s", ns[0].Conflist)
	}
	if _, err := ParseCNIConfig("{"); err == nil || !strings.Contains(err.Error(), "cniconfig") {
		t.Errorf("ParseCNIConfig of garbage = %v", err)
	}
	if ns, err := ParseCNIConfig(`{"Networks":null}`); err != nil || len(ns) != 0 {
		t.Errorf("no networks: %v, %v", ns, err)
	}
}
