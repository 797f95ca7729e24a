// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// rssExec is libcni's plugin executor with one addition: it starts every plugin
// through rsswrap and records the plugin's peak RSS (ru_maxrss, which covers the
// plugin's own waited-for children too, e.g. bridge's host-local). It is used only for
// the untimed RSS pass: rsswrap is one more process start.
type rssExec struct {
	wrap string
	mu   sync.Mutex
	peak map[string]int64 // plugin name -> KiB
}

var _ invoke.Exec = (*rssExec)(nil)

func newRSSExec(wrap string) *rssExec { return &rssExec{wrap: wrap, peak: map[string]int64{}} }

func (e *rssExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	kib, stdout, stderr, err := e.run(ctx, pluginPath, stdin, environ)
	if kib > 0 {
		name := filepath.Base(pluginPath)
		e.mu.Lock()
		if kib > e.peak[name] {
			e.peak[name] = kib
		}
		e.mu.Unlock()
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			var perr types.Error
			if jerr := json.Unmarshal(stdout, &perr); jerr == nil && perr.Code != 0 {
				return nil, &perr
			}
		}
		return nil, fmt.Errorf("%s: %v: stdout %q stderr %q", pluginPath, err, stdout, stderr)
	}
	return stdout, nil
}

// run starts path through rsswrap and returns the peak RSS it reported.
func (e *rssExec) run(ctx context.Context, path string, stdin []byte, environ []string) (int64, []byte, []byte, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, nil, err
	}
	defer r.Close()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, e.wrap, path)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.ExtraFiles = []*os.File{w}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return 0, nil, nil, fmt.Errorf("starting %s through rsswrap: %w", path, err)
	}
	report, _ := io.ReadAll(r)
	err = cmd.Wait()
	kib, _ := strconv.ParseInt(strings.TrimSpace(string(report)), 10, 64)
	return kib, stdout.Bytes(), stderr.Bytes(), err
}

// peakOf returns the largest RSS in KiB seen for plugin name, 0 if it never ran.
func (e *rssExec) peakOf(name string) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peak[name]
}

func (e *rssExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *rssExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(jsonBytes)
}
