// SPDX-License-Identifier: Apache-2.0

package delegate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

// The CNI library's invoke package does what this file does, and more podwire has no
// use for (OpenTelemetry trace propagation), which links net/http and OpenTelemetry
// into the binary: ~1.5 MB and ~1.5 ms of package initialization at every start of
// bridge, delegating or not. This is the part of its contract podwire relies on, with
// the same environment, the same lookup and the same errors.

// findPlugin returns the first regular file named plugin in paths (CNI_PATH).
func findPlugin(plugin string, paths []string) (string, error) {
	switch {
	case plugin == "":
		return "", errors.New("no plugin name provided")
	case strings.ContainsRune(plugin, os.PathSeparator):
		return "", fmt.Errorf("invalid plugin name: %s", plugin)
	case len(paths) == 0:
		return "", errors.New("no paths provided")
	}
	for _, dir := range paths {
		p := filepath.Join(dir, plugin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", plugin, paths)
}

// execPlugin runs plugin (looked up in CNI_PATH) for verb with this process's
// environment, CNI_COMMAND replaced, and netconf on stdin; it returns stdout. A
// failing plugin's JSON error comes back as a *types.Error; its stderr is passed on.
func execPlugin(ctx context.Context, plugin, verb string, netconf []byte) ([]byte, error) {
	path, err := findPlugin(plugin, filepath.SplitList(os.Getenv("CNI_PATH")))
	if err != nil {
		return nil, err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "CNI_COMMAND=") })
	env = append(env, "CNI_COMMAND="+verb)
	for attempt := 0; ; attempt++ {
		var stdout, stderr bytes.Buffer
		c := exec.CommandContext(ctx, path)
		c.Env, c.Stdin, c.Stdout, c.Stderr = env, bytes.NewReader(netconf), &stdout, &stderr
		err := c.Run()
		if err != nil && strings.Contains(err.Error(), "text file busy") && attempt < 5 {
			// The file is being replaced (an upgrade): try again in a second. (The
			// library means to; its retry reuses the started Cmd and always fails.)
			select {
			case <-time.After(time.Second):
				continue
			case <-ctx.Done():
				return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
			}
		}
		if err != nil {
			return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
		}
		_, _ = stderr.WriteTo(os.Stderr)
		return stdout.Bytes(), nil
	}
}

// pluginError is the CNI error a failed plugin printed, or one describing how it
// failed when it printed none.
func pluginError(err error, stdout, stderr []byte) error {
	var e types.Error
	switch {
	case len(stdout) > 0:
		if jerr := json.Unmarshal(stdout, &e); jerr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, jerr)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, err)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	}
	return &e
}

// execAdd runs ADD and parses the result: in its own cniVersion, or in the
// configuration's when the plugin printed none.
func execAdd(ctx context.Context, plugin string, netconf []byte) (types.Result, error) {
	out, err := execPlugin(ctx, plugin, "ADD", netconf)
	if err != nil {
		return nil, err
	}
	confVersion, err := (&version.ConfigDecoder{}).Decode(netconf)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("failed to unmarshal raw result: %w", err)
	}
	if v, ok := raw["cniVersion"].(string); ok && v != "" {
		return create.Create(v, out)
	}
	if raw == nil {
		raw = map[string]any{} // the plugin printed null
	}
	raw["cniVersion"] = confVersion
	if out, err = json.Marshal(raw); err != nil {
		return nil, fmt.Errorf("failed to remarshal fixed result: %w", err)
	}
	return create.Create(confVersion, out)
}
