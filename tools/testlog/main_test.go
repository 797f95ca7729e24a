// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A go test -json stream (as Go 1.26 writes it) with a pass, a failed subtest, a skip
// with a reason, a skip without one and a test binary that timed out.
const stream = `{"Action":"start","Package":"p/a"}
{"Action":"run","Package":"p/a","Test":"TestOK"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"    a_test.go:5: noise\n"}
{"Action":"output","Package":"p/a","Test":"TestOK","Output":"--- PASS: TestOK (0.00s)\n"}
{"Action":"pass","Package":"p/a","Test":"TestOK","Elapsed":0}
{"Action":"run","Package":"p/a","Test":"TestBad"}
{"Action":"output","Package":"p/a","Test":"TestBad","Output":"=== RUN   TestBad\n"}
{"Action":"run","Package":"p/a","Test":"TestBad/sub"}
{"Action":"output","Package":"p/a","Test":"TestBad/sub","Output":"    a_test.go:9: want 1, got 2\n"}
{"Action":"output","Package":"p/a","Test":"TestBad/sub","Output":"    --- FAIL: TestBad/sub (0.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestBad/sub","Elapsed":0}
{"Action":"output","Package":"p/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}
{"Action":"fail","Package":"p/a","Test":"TestBad","Elapsed":0}
{"Action":"run","Package":"p/a","Test":"TestVLAN"}
{"Action":"output","Package":"p/a","Test":"TestVLAN","Output":"=== RUN   TestVLAN\n"}
{"Action":"output","Package":"p/a","Test":"TestVLAN","Output":"    b_test.go:3: the running kernel is built without CONFIG_BRIDGE_VLAN_FILTERING (/proc/config.gz): no\n"}
{"Action":"output","Package":"p/a","Test":"TestVLAN","Output":"--- SKIP: TestVLAN (0.01s)\n"}
{"Action":"skip","Package":"p/a","Test":"TestVLAN","Elapsed":0.01}
{"Action":"skip","Package":"p/a","Test":"TestQuiet","Elapsed":0}
{"Action":"output","Package":"p/a","Output":"FAIL\n"}
{"Action":"output","Package":"p/a","Output":"FAIL\tp/a\t0.02s\n"}
{"Action":"fail","Package":"p/a","Elapsed":0.02}
{"Action":"run","Package":"p/b","Test":"TestHang"}
{"Action":"output","Package":"p/b","Test":"TestHang","Output":"    c_test.go:1: waiting\n"}
{"Action":"output","Package":"p/b","Output":"panic: test timed out after 1s\n"}
{"Action":"fail","Package":"p/b","Elapsed":1}
`

func TestSummary(t *testing.T) {
	var got strings.Builder
	s := newSummary(&got)
	readEvents(strings.NewReader(stream+"go: downloading x\n"), s.event, func(l string) { got.WriteString(l + "\n") })
	want := `--- PASS: TestOK (p/a, 0.0s)
=== output of failed TestBad/sub (p/a):
    a_test.go:9: want 1, got 2
    --- FAIL: TestBad/sub (0.00s)
=== output of failed TestBad (p/a):
=== RUN   TestBad
--- FAIL: TestBad (0.00s)
--- SKIP: TestVLAN (p/a, 0.0s)
--- SKIP: TestQuiet (p/a, 0.0s)
FAIL	p/a	0.02s
panic: test timed out after 1s
=== output of unfinished TestHang (p/b):
    c_test.go:1: waiting
go: downloading x
`
	if diff := cmp.Diff(want, got.String()); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}

func TestSkips(t *testing.T) {
	f := filepath.Join(t.TempDir(), "unit.json")
	if err := os.WriteFile(f, []byte(stream), 0o644); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	skips(&got, []string{f, filepath.Join(t.TempDir(), "absent.json")})
	want := `skipped tests: 2
--- SKIP: TestVLAN (p/a): b_test.go:3: the running kernel is built without CONFIG_BRIDGE_VLAN_FILTERING (/proc/config.gz): no
--- SKIP: TestQuiet (p/a): (no reason given)
`
	if diff := cmp.Diff(want, got.String()); diff != "" {
		t.Errorf("skips (-want +got):\n%s", diff)
	}
}
