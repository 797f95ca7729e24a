// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podwire/podwire/pkg/confkeys"
)

// Finding is one problem validate found.
type Finding struct {
	File    string `json:"file"`
	Where   string `json:"where,omitempty"` // e.g. plugins[0] (bridge).ipam.ranges
	Level   string `json:"level"`           // "error", "warning" or "note"
	Message string `json:"message"`
}

func (f Finding) String() string {
	where := ""
	if f.Where != "" {
		where = " " + f.Where
	}
	return fmt.Sprintf("%s:%s: %s: %s", f.File, where, f.Level, f.Message)
}

// validator collects findings for the files it is given.
type validator struct {
	binDirs  []string
	runtimes []foundRuntime // the node's, whose libcni must accept each cniVersion
	findings []Finding
	file     string
}

func (v *validator) errorf(where, format string, a ...any) {
	v.findings = append(v.findings, Finding{v.file, where, "error", fmt.Sprintf(format, a...)})
}

func (v *validator) notef(where, format string, a ...any) {
	v.findings = append(v.findings, Finding{v.file, where, "note", fmt.Sprintf(format, a...)})
}

func (v *validator) warnf(where, format string, a ...any) {
	v.findings = append(v.findings, Finding{v.file, where, "warning", fmt.Sprintf(format, a...)})
}

func runValidate(args []string, out io.Writer) error {
	fs := newFlags("validate")
	nd := nodeFlags(fs)
	asJSON := fs.Bool("json", false, "print findings as JSON")
	var rt runtimeFlags
	rt.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	paths := fs.Args()
	if len(paths) == 0 {
		paths = []string{nd.confDir}
	}
	v := &validator{binDirs: nd.binDirs}
	var errs []error
	v.runtimes, errs = rt.detect(context.Background())
	for _, err := range errs {
		fmt.Fprintf(os.Stderr, "podwire validate: %v\n", err)
	}
	for _, p := range paths {
		if err := v.path(p); err != nil {
			return err
		}
	}
	nerr, nwarn := 0, 0
	for _, f := range v.findings {
		switch f.Level {
		case "error":
			nerr++
		case "warning":
			nwarn++
		}
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Findings []Finding `json:"findings"`
		}{append([]Finding{}, v.findings...)}); err != nil {
			return err
		}
	} else {
		for _, f := range v.findings {
			fmt.Fprintln(out, f)
		}
		fmt.Fprintf(out, "%d errors, %d warnings\n", nerr, nwarn)
	}
	if nerr > 0 {
		return errFindings
	}
	return nil
}

// path validates one file, or every file a runtime would read in a directory, and
// there the names the files give their networks (the first file of a name wins: the
// others are never used).
func (v *validator) path(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: pass a conflist or a directory of them", err)
	}
	if !st.IsDir() {
		v.file = p
		v.validateFile(p)
		return nil
	}
	files, err := confFiles(p)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		v.file = p
		v.warnf("", "no .conf, .conflist or .json files: runtimes find no network here")
	}
	first := map[string]string{}
	for _, f := range files {
		v.file = f
		name := v.validateFile(f)
		if name == "" {
			continue
		}
		if prev, ok := first[name]; ok {
			v.errorf("name", "network %q is also defined by %s, which runtimes read first: this file is never used; rename one of the networks or remove a file", name, filepath.Base(prev))
			continue
		}
		first[name] = f
	}
	return nil
}

// validateFile checks one file and returns the network name it defines ("" when it
// has none or cannot be read).
func (v *validator) validateFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		v.errorf("", "%v", err)
		return ""
	}
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			line, col := lineCol(b, se.Offset)
			v.errorf(fmt.Sprintf("line %d, column %d", line, col), "not valid JSON: %v", se)
		} else {
			v.errorf("", "the file must hold one JSON object (a conflist): %v", err)
		}
		return ""
	}
	isList := strings.HasSuffix(path, ".conflist") || top["plugins"] != nil
	name, _ := top["name"].(string)
	if _, ok := top["name"]; !ok {
		v.errorf("name", `the network has no "name": runtimes identify networks (and libcni its cache, host-local its lease directory) by it; add "name": "<network>"`)
	} else if name == "" {
		v.errorf("name", `"name" must be a non-empty string`)
	}
	v.cniVersion(top)
	if isList {
		v.unknownKeys("", top, confkeys.List)
		v.plugins(top)
	} else {
		v.entry("", top, []map[string]any{top}, 0)
	}
	if _, err := loadBytes(b, isList); err != nil && !v.hasErrors() {
		v.errorf("", "libcni refuses it: %v", err)
	}
	return name
}

func loadBytes(b []byte, isList bool) (*libcni.NetworkConfigList, error) {
	if isList {
		return libcni.NetworkConfFromBytes(b)
	}
	c, err := libcni.ConfFromBytes(b)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(c)
}

func (v *validator) hasErrors() bool {
	for _, f := range v.findings {
		if f.File == v.file && f.Level == "error" {
			return true
		}
	}
	return false
}

// cniVersion checks the version against what the spec and this node's runtimes take.
func (v *validator) cniVersion(top map[string]any) {
	raw, ok := top["cniVersion"]
	if !ok {
		v.warnf("cniVersion", `no "cniVersion": libcni reads the configuration as 0.1.0 (no CHECK, GC or STATUS, old result format); set "cniVersion": "1.0.0" (or "1.1.0" where every runtime on the node accepts it)`)
		return
	}
	s, ok := raw.(string)
	if !ok {
		v.errorf("cniVersion", `"cniVersion" must be a string such as "1.0.0", not %s`, jsonKind(raw))
		return
	}
	if !slices.Contains(version.All.SupportedVersions(), s) {
		v.errorf("cniVersion", "cniVersion %q is not a CNI spec version podwire's plugins speak (%s)", s, strings.Join(version.All.SupportedVersions(), ", "))
		return
	}
	errs, notes := runtimeVerdicts(v.runtimes, s)
	for _, e := range errs {
		v.errorf("cniVersion", "%s", e)
	}
	for _, n := range notes {
		v.notef("cniVersion", "%s", n)
	}
}

// plugins checks the list's "plugins" and each entry in it.
func (v *validator) plugins(top map[string]any) {
	raw, ok := top["plugins"]
	if !ok {
		v.errorf("plugins", `a conflist needs "plugins": [ {...}, ... ]`)
		return
	}
	list, ok := raw.([]any)
	if !ok {
		v.errorf("plugins", `"plugins" must be a list of plugin entries [ {"type": ...}, ... ], not %s`, jsonKind(raw))
		return
	}
	if len(list) == 0 {
		v.errorf("plugins", `"plugins" is empty: runtimes refuse a network without plugins`)
		return
	}
	var entries []map[string]any
	for i, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			v.errorf(fmt.Sprintf("plugins[%d]", i), "each plugin entry must be an object {\"type\": ...}, not %s", jsonKind(e))
			m = map[string]any{}
		}
		entries = append(entries, m)
	}
	for i, m := range entries {
		v.entry(fmt.Sprintf("plugins[%d]", i), m, entries, i)
	}
}

// unknownKeys reports keys of m that known does not hold: an error when one is close
// to a known key (a typo the plugin silently ignores), else a warning.
func (v *validator) unknownKeys(where string, m map[string]any, known []string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if slices.Contains(known, k) {
			continue
		}
		if s := suggest(k, known); s != "" {
			v.errorf(join(where, k), "unknown key %q: did you mean %q? (the plugin ignores unknown keys, so this setting has no effect)", k, s)
		} else {
			v.warnf(join(where, k), "unknown key %q: the plugin ignores it", k)
		}
	}
}

func join(where, key string) string {
	if where == "" {
		return key
	}
	return where + "." + key
}

// jsonKind names a decoded JSON value's type in JSON's words.
func jsonKind(x any) string {
	switch x.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", x)
}

// lineCol turns a byte offset into a 1-based line and column.
func lineCol(b []byte, off int64) (line, col int) {
	off = min(off, int64(len(b)))
	before := b[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}
