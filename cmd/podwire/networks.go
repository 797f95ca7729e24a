// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// node is where the runtime's pieces are: the conf dir, the plugin dirs and libcni's
// cache of ADD results (which GC reads to DEL stale attachments).
type node struct {
	confDir  string
	binDirs  []string
	cacheDir string
	h        *host
}

// nodeFlags registers --conf-dir, --bin-dir and --cache-dir with the runtimes'
// defaults: NETCONFPATH as cnitool honours it, else /etc/cni/net.d; CNI_PATH, else
// /opt/cni/bin; libcni's /var/lib/cni.
func nodeFlags(fs *flag.FlagSet) *node {
	n := &node{h: realHost()}
	confDir := os.Getenv("NETCONFPATH")
	if confDir == "" {
		confDir = "/etc/cni/net.d"
	}
	binDirs := os.Getenv("CNI_PATH")
	if binDirs == "" {
		binDirs = "/opt/cni/bin"
	}
	fs.StringVar(&n.confDir, "conf-dir", confDir, "directory of conflists (NETCONFPATH)")
	fs.Func("bin-dir", "plugin directories, colon-separated (CNI_PATH; default "+binDirs+")", func(s string) error {
		n.binDirs = filepath.SplitList(s)
		return nil
	})
	n.binDirs = filepath.SplitList(binDirs)
	fs.StringVar(&n.cacheDir, "cache-dir", "/var/lib/cni", "libcni's cache of ADD results")
	return n
}

// network is one network configuration as a runtime loads it.
type network struct {
	File string
	List *libcni.NetworkConfigList
}

// confFiles lists the files libcni would read from dir, sorted as runtimes sort them.
func confFiles(dir string) ([]string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	sort.Strings(files)
	return files, nil
}

// loadFile parses a conflist, or a single-plugin .conf upconverted, with libcni.
func loadFile(file string) (*libcni.NetworkConfigList, error) {
	if strings.HasSuffix(file, ".conflist") {
		return libcni.NetworkConfFromFile(file)
	}
	c, err := libcni.ConfFromFile(file)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(c)
}

// networks loads every network in the conf dir; only, when set, picks one by name.
// As in libcni, the first file (in sorted order) that defines a name is that network.
func (n *node) networks(only string) ([]network, error) {
	files, err := confFiles(n.confDir)
	if err != nil {
		return nil, err
	}
	var out []network
	seen := map[string]bool{}
	for _, f := range files {
		l, err := loadFile(f)
		if err != nil {
			fmt.Fprintf(os.Stderr, "podwire: skipping %s: %v (run podwire validate %s)\n", f, err, f)
			continue
		}
		if seen[l.Name] || only != "" && l.Name != only {
			continue
		}
		seen[l.Name] = true
		out = append(out, network{File: f, List: l})
	}
	if only != "" && len(out) == 0 {
		return nil, fmt.Errorf("no network named %q in %s: list them with podwire inspect, or pass --conf-dir", only, n.confDir)
	}
	return out, nil
}

// plugin returns the first entry of type typ in the list, decoded into a generic map,
// with its bytes; nil when the list has none.
func plugin(l *libcni.NetworkConfigList, typ string) (map[string]any, []byte) {
	for _, p := range l.Plugins {
		if p.Network.Type != typ {
			continue
		}
		var m map[string]any
		if json.Unmarshal(p.Bytes, &m) != nil {
			return nil, nil
		}
		// Give the entry the list's name, as libcni does when it runs the plugin.
		m["name"] = l.Name
		b, _ := json.Marshal(m)
		return m, b
	}
	return nil, nil
}

// str is a string field of a decoded entry, or "".
func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}
