// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLacking(t *testing.T) {
	conf := parseConfig(strings.NewReader(`#
# Automatically generated file; DO NOT EDIT.
CONFIG_BRIDGE=y
# CONFIG_VLAN_8021Q is not set
CONFIG_NF_CT_NETLINK=m
CONFIG_DEFAULT_HOSTNAME="(none)"
`))
	if diff := cmp.Diff(map[string]string{"CONFIG_BRIDGE": "y", "CONFIG_NF_CT_NETLINK": "m", "CONFIG_DEFAULT_HOSTNAME": "(none)"}, conf); diff != "" {
		t.Errorf("parseConfig (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		options []string
		lacks   string
		modules []string
	}{
		{[]string{"CONFIG_BRIDGE"}, "", nil},
		{[]string{"CONFIG_BRIDGE", "CONFIG_VLAN_8021Q"}, "CONFIG_VLAN_8021Q", nil},
		// Kconfig leaves out an option whose dependencies are off.
		{[]string{"CONFIG_BRIDGE_VLAN_FILTERING"}, "CONFIG_BRIDGE_VLAN_FILTERING", nil},
		{[]string{"CONFIG_NF_CT_NETLINK", "CONFIG_BRIDGE"}, "", []string{"CONFIG_NF_CT_NETLINK=m"}},
	} {
		lacks, modules := lacking(conf, tc.options)
		if lacks != tc.lacks || !cmp.Equal(modules, tc.modules) {
			t.Errorf("lacking(%v) = %q, %v; want %q, %v", tc.options, lacks, modules, tc.lacks, tc.modules)
		}
	}
}

func TestCI(t *testing.T) {
	for v, want := range map[string]bool{"": false, "false": false, "0": false, "true": true, "1": true} {
		t.Setenv("CI", v)
		if CI() != want {
			t.Errorf("CI=%q: CI() = %v, want %v", v, !want, want)
		}
	}
}

// The running kernel's configuration is readable here, or KernelLacks cannot tell a
// kernel without a feature from a broken machine.
func TestKernelConfigReadable(t *testing.T) {
	conf, where, err := kernelConfig()
	if err != nil {
		Missing(t, "%v", err)
	}
	if conf["CONFIG_NET"] != "y" {
		t.Errorf("%s has no CONFIG_NET=y: %d options read", where, len(conf))
	}
}
