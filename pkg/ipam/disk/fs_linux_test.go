// SPDX-License-Identifier: Apache-2.0

package disk_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/internal/testenv"
	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

// smallTmpfs mounts a 1 MiB tmpfs on a fresh temp dir (root only) and unmounts it at
// cleanup.
func smallTmpfs(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("podwire-test", dir, "tmpfs", 0, "size=1m,mode=0755"); err != nil {
		testenv.KernelLacks(t, fmt.Sprintf("cannot mount a tmpfs: %v", err), "CONFIG_TMPFS")
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file until the filesystem is full and returns a function that
// removes it.
func fill(t *testing.T, dir string) func() {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// Fill the last partial page too.
	for {
		if _, err := f.Write(buf[:512]); err != nil {
			break
		}
	}
	f.Close()
	return func() { os.Remove(p) }
}

// snapshotTree lists every file and directory under dir (contents of lease files
// included), to prove a failed call left nothing behind.
func snapshotTree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "filler" {
			return nil
		}
		line := rel
		if fi.Mode().IsRegular() && !strings.HasPrefix(rel, "net1/.podwire") {
			b, _ := os.ReadFile(p)
			line += " " + string(b)
		}
		out = append(out, line)
		return nil
	})
	return strings.Join(out, "\n")
}

func TestDiskFull(t *testing.T) {
	dataDir := smallTmpfs(t)
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	unfill := fill(t, dataDir)
	before := snapshotTree(t, dataDir)
	_, err := ipam.Allocate(ctx, st, c, own("b"))
	if cniplumb.Code(err) != cniplumb.CodeIOFailure || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("ADD on a full disk: %v (code %d), want code 5 saying the disk is full", err, cniplumb.Code(err))
	}
	t.Logf("ADD on a full disk: %v", err)
	if d := cmp.Diff(before, snapshotTree(t, dataDir)); d != "" {
		t.Errorf("a failed ADD left files behind (-before +after):\n%s", d)
	}
	if err := ipam.Status(ctx, st, c); cniplumb.Code(err) != cniplumb.CodeNotAvailable {
		t.Errorf("STATUS on a full disk: %v", err)
	}
	// DEL needs no space.
	if err := ipam.Release(ctx, st, own("a")); err != nil {
		t.Errorf("DEL on a full disk: %v", err)
	}
	unfill()
	allocate(t, st, c, own("b"))
	if err := ipam.Check(ctx, st, c, own("b"), nil); err != nil {
		t.Error(err)
	}
}

func TestReadOnly(t *testing.T) {
	dataDir := smallTmpfs(t)
	st := open(t, dataDir, disk.Options{})
	c := parse(t, dual)
	allocate(t, st, c, own("a"))
	if err := unix.Mount("", dataDir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting read-only: %v", err)
	}
	before := snapshotTree(t, dataDir)
	_, err := ipam.Allocate(ctx, st, c, own("b"))
	if cniplumb.Code(err) != cniplumb.CodeIOFailure || !strings.Contains(err.Error(), "read-only file system") {
		t.Fatalf("ADD on a read-only disk: %v (code %d)", err, cniplumb.Code(err))
	}
	t.Logf("ADD on a read-only disk: %v", err)
	err = ipam.Status(ctx, st, c)
	if cniplumb.Code(err) != cniplumb.CodeNotAvailable || !strings.Contains(err.Error(), "cannot be written") {
		t.Errorf("STATUS on a read-only disk: %v", err)
	}
	// CHECK only reads.
	if err := ipam.Check(ctx, st, c, own("a"), nil); err != nil {
		t.Errorf("CHECK on a read-only disk: %v", err)
	}
	if err := ipam.Release(ctx, st, own("a")); cniplumb.Code(err) != cniplumb.CodeIOFailure {
		t.Errorf("DEL on a read-only disk: %v", err)
	}
	if d := cmp.Diff(before, snapshotTree(t, dataDir)); d != "" {
		t.Errorf("changed (-before +after):\n%s", d)
	}
}
