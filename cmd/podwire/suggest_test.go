// SPDX-License-Identifier: Apache-2.0

package main

import "testing"

func TestSuggest(t *testing.T) {
	known := []string{"isGateway", "isDefaultGateway", "ipMasq", "ipMasqBackend", "mtu", "bridge", "dataDir", "subnet"}
	for _, tc := range []struct{ key, want string }{
		{"isGatway", "isGateway"},
		{"isgateway", "isGateway"},
		{"ipmasq", "ipMasq"},
		{"ipMasqBakend", "ipMasqBackend"},
		{"subent", "subnet"},
		{"datadir", "dataDir"},
		{"brdige", "bridge"},
		{"mut", "mtu"},
		{"hostname", ""},
		{"x", ""},
	} {
		if got := suggest(tc.key, known); got != tc.want {
			t.Errorf("suggest(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"abc", "abc", 0}, {"abc", "acb", 1}, {"kitten", "sitting", 3}, {"subent", "subnet", 1}} {
		if got := distance(tc.a, tc.b); got != tc.d {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
