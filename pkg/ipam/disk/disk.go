// SPDX-License-Identifier: Apache-2.0

// Package disk is host-local's lease store on disk, file-compatible with the
// reference host-local (containernetworking/plugins) so either binary can take over
// from the other under live pods:
//
//	<dataDir>/<network>/                 0755, as the reference creates it
//	    lock                             flock(LOCK_EX) for the whole of every operation
//	    <ip>                             one lease: "<containerID>\r\n<ifname>", 0600
//	    last_reserved_ip.<rangeSetIndex> the last address reserved from that set, 0600
//	    .podwire/                        0700, podwire's index; the reference ignores it
//	        state                        JSON: boot ID, the directory's mtime and the
//	                                     last_reserved_ip contents at our last commit
//	        owners/<hash>                JSON per attachment: its leases, each with the
//	                                     lease file's inode+mtime and the boot ID it
//	                                     was made (or first seen) in
//	        spare/<n>                    empty files kept for reuse (spare.go)
//	        lease.<random>.tmp           a lease being written by one call (gone after it)
//
// Lookups by attachment read one owners/ file, and new leases are placed with
// RENAME_NOREPLACE (or link(2)), which fails on an existing name, so ADD and DEL cost
// the same with ten leases or ten thousand. The index is a cache: every lease it names
// is verified against the lease file before use, and it is rebuilt from the lease
// files whenever it may have missed a change (see begin). Nothing inside the network
// directory is followed if it is a symlink (fs.go), and the locks hold even when the
// lock file is removed under them (lock.go).
package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/ipam"
)

// File names shared with the reference host-local.
const (
	lockName     = "lock"
	lastIPPrefix = "last_reserved_ip."
	lineBreak    = "\r\n"
	sideDirName  = ".podwire"
)

// BootIDPath is where the kernel publishes the ID of the current boot.
const BootIDPath = "/proc/sys/kernel/random/boot_id"

// DefaultBrokenGrace is how old an empty lease file must be before it counts as
// broken (left by a crashed writer) and may be reclaimed.
const DefaultBrokenGrace = 10 * time.Second

// Options tune a Store; the zero value is what the plugin uses.
type Options struct {
	// BootID overrides the current boot's ID (default: read from BootIDPath).
	BootID string
	// BrokenGrace overrides DefaultBrokenGrace.
	BrokenGrace time.Duration
	// Now overrides time.Now, for tests.
	Now func() time.Time
}

// Store is the lease store of one network.
type Store struct {
	dir   string // <dataDir>/<network>
	side  string // dir/.podwire
	boot  string
	grace time.Duration
	now   func() time.Time
}

var _ ipam.Store = (*Store)(nil)

// Open returns the store of network under dataDir. It creates nothing: the
// directories are made by the first transaction that needs them. network must be a
// single path element; anything else is refused, so no file is ever written outside
// <dataDir>/<network>.
func Open(dataDir, network string, opts Options) (*Store, error) {
	if !filepath.IsAbs(dataDir) {
		return nil, cniplumb.ConfigError("ipam.dataDir", "%q is not an absolute path", dataDir)
	}
	dataDir = filepath.Clean(dataDir)
	dir := filepath.Join(dataDir, network)
	if network == "" || network == "." || network == ".." || strings.ContainsAny(network, "/\x00") || filepath.Dir(dir) != dataDir {
		return nil, cniplumb.ConfigError("name", "network name %q cannot be used as a directory name under %s", network, dataDir)
	}
	s := &Store{dir: dir, side: filepath.Join(dir, sideDirName), boot: opts.BootID, grace: opts.BrokenGrace, now: opts.Now}
	if s.boot == "" {
		b, err := os.ReadFile(BootIDPath)
		if err == nil {
			s.boot = strings.TrimSpace(string(b))
		}
		// Without a boot ID (no /proc) nothing is ever judged to be from a previous
		// boot: leases are then only released by DEL and GC, as in the reference.
	}
	if s.grace == 0 {
		s.grace = DefaultBrokenGrace
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Dir is the network's lease directory.
func (s *Store) Dir() string { return s.dir }

// Exists reports whether the network's directory exists (false: no lease was ever
// made, and DEL, GC and CHECK need not create it).
func (s *Store) Exists() bool {
	fi, err := os.Stat(s.dir)
	return err == nil && fi.IsDir()
}

// Do runs f holding the network's locks (see lockDir): an exclusive flock on <dir>/lock,
// the same lock the reference host-local takes, so our processes and the reference's
// exclude each other, and one on the directory, which keeps podwire's calls apart
// even when the lock file is removed under them. It brings the index up to date
// first and records the directory's state after f.
func (s *Store) Do(ctx context.Context, f func(ipam.Tx) error) (err error) {
	l, err := s.lockDir(ctx)
	if err != nil {
		return err
	}
	defer l.close()
	t := newTx(s, l)
	defer t.close()
	if err := t.begin(); err != nil {
		t.abort()
		return err
	}
	ferr := f(t)
	if cerr := t.commit(); cerr != nil {
		if ferr != nil {
			return fmt.Errorf("%w (and saving the lease index failed: %v)", ferr, cerr)
		}
		return cerr
	}
	return ferr
}

// ioError is a code-5 error naming what failed, with a hint for the two conditions an
// operator can fix.
func ioError(what string, err error) error {
	switch {
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		err = fmt.Errorf("%w: free space on the filesystem holding the lease directory", err)
	case errors.Is(err, unix.EROFS):
		err = fmt.Errorf("%w: the lease directory must be on a writable filesystem (ipam.dataDir)", err)
	}
	return cniplumb.IOError(what, err)
}
