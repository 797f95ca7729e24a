// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

var fuzzSeeds = []string{
	`{"cniVersion":"1.0.0","name":"n","type":"t"}`,
	`{"cniVersion":"0.3.1","name":"n","prevResult":{"interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"4","address":"10.1.2.3/24","interface":0}]}}`,
	`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}`,
	`{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"::1/128","gateway":"::2","interface":-1}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{"nameservers":["1.1.1.1"]}}}`,
	`{"cniVersion":`, `null`, `[]`, `{"name":7}`,
}

// FuzzParseInput feeds arbitrary stdin to the shared config and prevResult parsing.
// Errors are fine; panics are not, and every error must carry a CNI code.
func FuzzParseInput(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	env := func(k string) string {
		return map[string]string{"CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0", "CNI_NETNS": "/x", "CNI_PATH": "/y"}[k]
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		if _, err := preflightConf(stdin, SupportedVersions); err != nil {
			if Code(err) == CodeInternal {
				t.Fatalf("preflight error without a CNI code: %v", err)
			}
			return
		}
		in, err := parseInput("ADD", env, stdin)
		if err != nil {
			if Code(err) == CodeInternal {
				t.Fatalf("parse error without a CNI code: %v", err)
			}
			return
		}
		_ = in.Owner().Key()
		if in.PrevResult != nil {
			// A parsed prevResult must convert to every version we speak, or fail cleanly.
			for _, v := range SupportedVersions {
				_, _ = in.PrevResult.GetAsVersion(v)
			}
		}
	})
}

// FuzzResultConversion parses arbitrary result JSON at each supported version and
// converts it to every other one.
func FuzzResultConversion(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, data []byte, vi uint8) {
		from := SupportedVersions[int(vi)%len(SupportedVersions)]
		res, err := version.NewResult(from, data)
		if err != nil {
			return
		}
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			return
		}
		for _, to := range SupportedVersions {
			if r, err := cur.GetAsVersion(to); err == nil {
				var _ types.Result = r
			}
		}
	})
}

// FuzzValidate checks the env validators never panic and accept only spec-valid IDs.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{"abc", "a/b", "..", "eth0", "a234567890123456", "", "x\x00y", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if checkID("container ID", s) == "" {
			for i, r := range s {
				ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || (i > 0 && (r == '_' || r == '.' || r == '-'))
				if !ok {
					t.Fatalf("checkID accepted %q", s)
				}
			}
		}
		if checkIfName(s) == "" && (len(s) > 15 || s == "" || s == "." || s == "..") {
			t.Fatalf("checkIfName accepted %q", s)
		}
		var a struct {
			types.CommonArgs
			IP types.UnmarshallableString
		}
		if err := LoadArgs("fuzz", s, &a); err != nil && Code(err) != CodeInvalidEnv {
			t.Fatalf("LoadArgs(%q): %v, want code 4", s, err)
		}
	})
}
