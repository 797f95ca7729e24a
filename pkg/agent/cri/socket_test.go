// SPDX-License-Identifier: Apache-2.0

package cri

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPickSocket lays out a node's runtime directories in a temp dir: containerd's
// socket dir empty (a CRI-O node where the DaemonSet's DirectoryOrCreate made it),
// CRI-O's with a listening socket, and a regular file where a socket is expected.
func TestPickSocket(t *testing.T) {
	dir := t.TempDir()
	ctrd := filepath.Join(dir, "containerd", "containerd.sock")
	crio := filepath.Join(dir, "crio", "crio.sock")
	file := filepath.Join(dir, "not-a-socket")
	for _, d := range []string{filepath.Dir(ctrd), filepath.Dir(crio)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", crio)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, tc := range []struct{ name, list, want, wantErr string }{
		{name: "the first absent, the second present", list: ctrd + "," + crio, want: crio},
		{name: "unix:// URLs and spaces", list: " unix://" + ctrd + " , unix://" + crio, want: "unix://" + crio},
		{name: "both listed, present one first", list: crio + "," + ctrd, want: crio},
		{name: "a file is not a socket", list: file + "," + crio, want: crio},
		{name: "one socket is taken as it is", list: ctrd, want: ctrd},
		{name: "none present", list: ctrd + "," + file, wantErr: "none of the CRI sockets"},
		{name: "empty disables", list: "", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PickSocket(tc.list)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PickSocket(%q) = %q, %v; want an error with %q", tc.list, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("PickSocket(%q) = %q, %v; want %q", tc.list, got, err, tc.want)
			}
		})
	}
	if !strings.Contains(DefaultSockets, "/run/crio/crio.sock") || !strings.HasPrefix(DefaultSockets, "/run/containerd/containerd.sock,") {
		t.Errorf("DefaultSockets %q: containerd's first, then CRI-O's", DefaultSockets)
	}
}
