// SPDX-License-Identifier: Apache-2.0

// Package install puts the plugin binaries and the conflist on the host, atomically, and
// remembers exactly what it wrote (a manifest with content hashes in the state dir), so
// that an upgrade replaces only its own files and uninstall removes only those whose
// content is still what it wrote.
package install

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// Kind tells what an installed file is.
type Kind string

const (
	Binary   Kind = "binary"
	Conflist Kind = "conflist"
)

// Entry is one file the agent wrote.
type Entry struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Kind   Kind   `json:"kind"`
	// Backup is where the foreign file this one replaced (--replace-foreign) was saved;
	// uninstall puts it back.
	Backup string `json:"backup,omitempty"`
}

// Manifest is the state dir's record of installed files.
type Manifest struct {
	Version int     `json:"version"`
	Files   []Entry `json:"files"`
}

const manifestName = "manifest.json"

// Installer installs into one host; the zero value is not usable, use New.
type Installer struct {
	StateDir       string
	ReplaceForeign bool
	// Skip names files of the source dir that are not plugins (the agent itself, when
	// the source dir is a build's bin/).
	Skip []string
	m    Manifest
	// swept are the directories whose leftover temporary files are already removed
	// (once per Installer: a start of the agent).
	swept map[string]bool
}

// New loads the manifest from stateDir (none yet is an empty manifest).
func New(stateDir string, replaceForeign bool) (*Installer, error) {
	in := &Installer{StateDir: stateDir, ReplaceForeign: replaceForeign, m: Manifest{Version: 1}}
	b, err := os.ReadFile(filepath.Join(stateDir, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return in, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the install manifest: %w", err)
	}
	if err := json.Unmarshal(b, &in.m); err != nil {
		return nil, fmt.Errorf("the install manifest %s is corrupt (%w); move it away only if you know what the agent installed", filepath.Join(stateDir, manifestName), err)
	}
	return in, nil
}

// Manifest returns a copy of the current manifest.
func (in *Installer) Manifest() Manifest {
	m := in.m
	m.Files = slices.Clone(in.m.Files)
	return m
}

func (in *Installer) entry(path string) (int, *Entry) {
	for i := range in.m.Files {
		if in.m.Files[i].Path == path {
			return i, &in.m.Files[i]
		}
	}
	return -1, nil
}

func (in *Installer) save() error {
	if err := os.MkdirAll(in.StateDir, 0o700); err != nil {
		return fmt.Errorf("creating state dir %s: %w", in.StateDir, err)
	}
	sort.Slice(in.m.Files, func(i, j int) bool { return in.m.Files[i].Path < in.m.Files[j].Path })
	b, err := json.MarshalIndent(in.m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(in.StateDir, manifestName), append(b, '\n'), 0o600)
}

// Action is what happened to one file.
type Action string

const (
	Installed Action = "installed" // written (new or replacing our older version)
	Unchanged Action = "unchanged" // already the wanted content
	Foreign   Action = "foreign"   // someone else's file, left alone
	Replaced  Action = "replaced"  // someone else's file, replaced (ReplaceForeign), backed up
	Removed   Action = "removed"
	Kept      Action = "kept" // uninstall: content changed since we wrote it, left alone
	Restored  Action = "restored"
	// Swept: a temporary file a killed install left (its Path), removed.
	Swept Action = "swept"
)

// Result is one file's outcome.
type Result struct {
	Path   string
	Action Action
}

// place makes dst hold content (from src when src != "", else b); it decides by owner:
// our own file (in the manifest, content as we wrote it) is replaced; a file that is
// already the wanted content is left; any other file is foreign.
func (in *Installer) place(dst, src string, b []byte, kind Kind, mode os.FileMode) (Result, error) {
	want := hashBytes(b)
	if src != "" {
		h, err := hashFile(src)
		if err != nil || h == "" {
			return Result{}, fmt.Errorf("reading the shipped file %s: %w", src, errors.Join(err, fs.ErrNotExist))
		}
		want = h
	}
	have, err := hashFile(dst)
	if err != nil {
		return Result{}, err
	}
	i, e := in.entry(dst)
	ours := e != nil && e.SHA256 == have
	if e != nil && !ours {
		// Replaced or removed by someone else since we wrote it: not ours any more.
		in.m.Files = slices.Delete(in.m.Files, i, i+1)
		e = nil
	}
	if have == want {
		return Result{dst, Unchanged}, nil
	}
	action, backup := Installed, ""
	if have != "" && !ours {
		if !in.ReplaceForeign {
			return Result{dst, Foreign}, nil
		}
		backup = filepath.Join(in.StateDir, "foreign", filepath.Base(filepath.Dir(dst))+"_"+filepath.Base(dst))
		if err := os.MkdirAll(filepath.Dir(backup), 0o700); err != nil {
			return Result{}, err
		}
		if err := copyAtomic(dst, backup, 0o600); err != nil {
			return Result{}, fmt.Errorf("backing up %s before replacing it: %w", dst, err)
		}
		action = Replaced
	} else if e != nil {
		backup = e.Backup
	}
	if src != "" {
		err = copyAtomic(src, dst, mode)
	} else {
		err = writeFileAtomic(dst, b, mode)
	}
	if err != nil {
		return Result{}, err
	}
	ne := Entry{Path: dst, SHA256: want, Kind: kind, Backup: backup}
	if i, e := in.entry(dst); e != nil {
		in.m.Files[i] = ne
	} else {
		in.m.Files = append(in.m.Files, ne)
	}
	return Result{dst, action}, nil
}

// sweep removes dir's leftover temporary files, the first time it is asked for dir.
func (in *Installer) sweep(dir string) ([]Result, error) {
	if in.swept[dir] {
		return nil, nil
	}
	gone, err := removeTemps(dir)
	var out []Result
	for _, p := range gone {
		out = append(out, Result{p, Swept})
	}
	if err == nil {
		if in.swept == nil {
			in.swept = map[string]bool{}
		}
		in.swept[dir] = true
	}
	return out, err
}

// Binaries copies every regular file of srcDir into binDir. It saves the manifest even
// when a file fails, so what was written stays recorded. The first call also removes
// the temporary files an install killed midway left in binDir and the state dir; the
// binaries such an install did not rename into place yet are copied again, since their
// content is not the wanted one (a file it never reached is still the old version, one
// missing is written anew).
func (in *Installer) Binaries(srcDir, binDir string) ([]Result, error) {
	ents, err := os.ReadDir(srcDir)
	if err != nil {
		return nil, fmt.Errorf("listing the shipped plugins in %s (set --source-bin-dir): %w", srcDir, err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", binDir, err)
	}
	var out []Result
	var errs []error
	for _, dir := range []string{binDir, in.StateDir} {
		rs, err := in.sweep(dir)
		out = append(out, rs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, de := range ents {
		if !de.Type().IsRegular() || slices.Contains(in.Skip, de.Name()) || de.Name()[0] == '.' {
			continue
		}
		r, err := in.place(filepath.Join(binDir, de.Name()), filepath.Join(srcDir, de.Name()), nil, Binary, 0o755)
		if err != nil {
			errs = append(errs, fmt.Errorf("installing %s: %w", de.Name(), err))
			continue
		}
		out = append(out, r)
	}
	if err := in.save(); err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// Conflist writes b as path (after the binaries: a runtime that sees the conflist finds
// its plugins).
func (in *Installer) Conflist(path string, b []byte) (Result, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Result{}, fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
	}
	// A leftover temporary conflist is never loaded (libcni reads .conf, .conflist and
	// .json only) but is removed all the same; an error here does not stop the write.
	_, _ = in.sweep(filepath.Dir(path))
	r, err := in.place(path, "", b, Conflist, 0o644)
	if err != nil {
		return r, fmt.Errorf("writing the conflist %s: %w", path, err)
	}
	return r, in.save()
}

// Uninstall removes every recorded file whose content is still what the agent wrote
// (conflists first, so the runtime stops using the network before its plugins go),
// restores backed-up foreign files, and removes the manifest when nothing is left.
func (in *Installer) Uninstall() ([]Result, error) {
	files := slices.Clone(in.m.Files)
	sort.SliceStable(files, func(i, j int) bool { return files[i].Kind == Conflist && files[j].Kind != Conflist })
	var out []Result
	var errs []error
	var left []Entry
	for _, e := range files {
		gone, err := removeIfHash(e.Path, e.SHA256)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", e.Path, err))
			left = append(left, e)
			continue
		}
		if !gone {
			if h, _ := hashFile(e.Path); h != "" {
				out = append(out, Result{e.Path, Kept})
				continue
			}
		}
		if e.Backup != "" {
			mode := os.FileMode(0o755)
			if e.Kind == Conflist {
				mode = 0o644
			}
			if err := copyAtomic(e.Backup, e.Path, mode); err != nil {
				errs = append(errs, fmt.Errorf("restoring %s from %s: %w", e.Path, e.Backup, err))
				left = append(left, e)
				continue
			}
			os.Remove(e.Backup)
			out = append(out, Result{e.Path, Restored})
			continue
		}
		out = append(out, Result{e.Path, Removed})
	}
	in.m.Files = left
	if len(left) == 0 {
		os.Remove(filepath.Join(in.StateDir, "foreign"))
		if err := os.Remove(filepath.Join(in.StateDir, manifestName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		return out, errors.Join(errs...)
	}
	if err := in.save(); err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}
