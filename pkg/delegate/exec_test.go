// SPDX-License-Identifier: Apache-2.0

package delegate

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// script writes an executable shell plugin into dir.
func script(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestExecPlugin(t *testing.T) {
	dir := t.TempDir()
	empty := t.TempDir()
	if err := os.Mkdir(filepath.Join(empty, "dirplugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", empty+string(filepath.ListSeparator)+dir)
	t.Setenv("CNI_COMMAND", "VERSION")
	script(t, dir, "noversion", `echo '{"ips":[{"address":"10.1.2.3/24"}]}'`)
	script(t, dir, "null", `echo null`)
	script(t, dir, "v040", `echo '{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.2.4/24"}]}'`)
	script(t, dir, "cmd", `[ "$CNI_COMMAND" = DEL ] || { echo "{\"code\":7,\"msg\":\"got $CNI_COMMAND\"}"; exit 1; }`)
	script(t, dir, "jsonerr", `echo '{"code":11,"msg":"busy","details":"d"}'; exit 1`)
	script(t, dir, "stderronly", `echo oops >&2; exit 3`)
	script(t, dir, "silent", `exit 4`)
	script(t, dir, "garbage", `echo not-json; exit 1`)
	script(t, dir, "dirplugin", `echo '{"cniVersion":"1.0.0"}'`) // found after the directory of that name
	conf := []byte(`{"cniVersion":"1.0.0","name":"n","type":"x"}`)
	ctx := context.Background()

	r, err := execAdd(ctx, "noversion", conf)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := current.GetResult(r); err != nil || r.Version() != "1.0.0" || !strings.HasPrefix(res.IPs[0].Address.String(), "10.1.2.3/") {
		t.Errorf("no cniVersion in the result: %+v %v, want the configuration's 1.0.0", r, err)
	}
	if r, err := execAdd(ctx, "null", conf); err != nil || r.Version() != "1.0.0" {
		t.Errorf("null result: %v %v", r, err)
	}
	if r, err := execAdd(ctx, "v040", conf); err != nil || r.Version() != "0.4.0" {
		t.Errorf("a result keeps its own cniVersion: %v %v", r, err)
	}
	if r, err := execAdd(ctx, "dirplugin", conf); err != nil || r.Version() != "1.0.0" {
		t.Errorf("a directory named like the plugin is skipped: %v %v", r, err)
	}
	if _, err := execPlugin(ctx, "cmd", "DEL", conf); err != nil {
		t.Errorf("CNI_COMMAND is the verb: %v", err)
	}
	for _, tc := range []struct {
		plugin string
		code   uint
		msg    string
	}{
		{"jsonerr", 11, "busy"},
		{"stderronly", 0, `netplugin failed: "oops\n": exit status 3`},
		{"silent", 0, "netplugin failed with no error message: exit status 4"},
		{"garbage", 0, `netplugin failed but error parsing its diagnostic message "not-json\n"`},
	} {
		_, err := execPlugin(ctx, tc.plugin, "ADD", conf)
		e, ok := err.(*types.Error)
		if !ok || e.Code != tc.code || !strings.HasPrefix(e.Msg, tc.msg) {
			t.Errorf("%s: %#v, want code %d and a message starting %q", tc.plugin, err, tc.code, tc.msg)
		}
	}
	for plugin, want := range map[string]string{
		"":        "no plugin name provided",
		"a/b":     "invalid plugin name: a/b",
		"missing": `failed to find plugin "missing" in path`,
	} {
		if _, err := execPlugin(ctx, plugin, "ADD", conf); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("plugin %q: %v, want %q", plugin, err, want)
		}
	}
	if _, err := findPlugin("x", nil); err == nil || err.Error() != "no paths provided" {
		t.Errorf("no paths: %v", err)
	}
}
