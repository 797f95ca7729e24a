// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// The names the image answers to: the plain ones go through tools/iptables-wrapper,
// which picks the host's mode; the -nft and -legacy ones name a mode themselves.
var (
	wrapped = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}
	modes   = map[string]string{"nft": "xtables-nft-multi", "legacy": "xtables-legacy-multi"}
)

// xtablesFiles is what the image needs of the build machine's Debian iptables package:
// its two multi binaries and its extensions (which libxtables dlopens, so no loader
// lists them), plus exactly the shared libraries and the ELF interpreter these need, as
// ldd (the loader's own resolution) names them. Paths are as on the machine.
func xtablesFiles() ([]string, error) {
	out, err := exec.Command("dpkg", "-L", "iptables").Output()
	if err != nil {
		return nil, fmt.Errorf("listing Debian's iptables package (apt-get install iptables on the build machine, or build without -iptables-wrapper): %w", err)
	}
	var elfs []string
	for _, f := range strings.Split(string(out), "\n") {
		switch {
		case f == "/usr/sbin/"+modes["nft"] || f == "/usr/sbin/"+modes["legacy"]:
		case strings.Contains(f, "/xtables/") && strings.HasSuffix(f, ".so"):
		default:
			continue
		}
		// Some extensions are links to others (libxt_DNAT.so -> libxt_NAT.so).
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
			elfs = append(elfs, f)
		}
	}
	if len(elfs) < 3 {
		return nil, fmt.Errorf("Debian's iptables package lists %d of its binaries and extensions here; reinstall it (apt-get install --reinstall iptables)", len(elfs))
	}
	set := map[string]bool{}
	for _, f := range elfs {
		set[f] = true
		deps, err := ldd(f)
		if err != nil {
			return nil, err
		}
		for _, d := range deps {
			set[d] = true
		}
	}
	files := make([]string, 0, len(set))
	for f := range set {
		files = append(files, f)
	}
	sort.Strings(files)
	return files, nil
}

// ldd lists the libraries bin loads and its interpreter, by the paths the loader
// resolves (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6`, `/lib64/ld-linux-x86-64.so.2`).
func ldd(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	var deps []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			deps = append(deps, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			deps = append(deps, f[0])
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s is not found on the build machine", bin, f[0])
		}
	}
	return deps, nil
}

// writeXtables adds files (their content, symlinks followed, at the paths given), the
// wrapper as /usr/sbin/iptables-wrapper and the tools' names as links.
func writeXtables(tw *tar.Writer, files []string, wrapper string) error {
	dirs := map[string]bool{}
	var mkdirs func(d string) error
	mkdirs = func(d string) error {
		if d == "." || d == "/" || dirs[d] {
			return nil
		}
		if err := mkdirs(path.Dir(d)); err != nil {
			return err
		}
		dirs[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch})
	}
	add := func(name, src string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		name = strings.TrimPrefix(name, "/")
		if err := mkdirs(path.Dir(name)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	}
	link := func(name, target string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "usr/sbin/" + name, Linkname: target, Mode: 0o777, ModTime: epoch})
	}
	for _, f := range files {
		// An extension linked to another in its directory stays a link; libraries are
		// copied as the loader opens them (libxtables.so.12, not the versioned file).
		if t, err := os.Readlink(f); err == nil && strings.Contains(f, "/xtables/") && !strings.Contains(t, "/") {
			name := strings.TrimPrefix(f, "/")
			if err := mkdirs(path.Dir(name)); err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: t, Mode: 0o777, ModTime: epoch}); err != nil {
				return err
			}
			continue
		}
		if err := add(f, f); err != nil {
			return err
		}
	}
	if err := add("/usr/sbin/iptables-wrapper", wrapper); err != nil {
		return fmt.Errorf("the iptables wrapper (go build ./tools/iptables-wrapper): %w", err)
	}
	for _, n := range wrapped {
		if err := link(n, "iptables-wrapper"); err != nil {
			return err
		}
		// iptables-save -> iptables-nft-save, ip6tables -> ip6tables-nft, ...
		fam, rest, _ := strings.Cut(n, "-")
		for mode, multi := range modes {
			name := fam + "-" + mode
			if rest != "" {
				name += "-" + rest
			}
			if err := link(name, filepath.Base(multi)); err != nil {
				return err
			}
		}
	}
	return nil
}
