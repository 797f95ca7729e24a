package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// rssExec is libcni's plugin executor with one addition: it records the peak RSS of
// every plugin process it starts (wait4's ru_maxrss, which covers the plugin's own
// children too, e.g. bridge's host-local).
type rssExec struct {
	mu   sync.Mutex
	peak map[string]int64 // plugin name -> KiB
}

var _ invoke.Exec = (*rssExec)(nil)

func newRSSExec() *rssExec { return &rssExec{peak: map[string]int64{}} }

func (e *rssExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, pluginPath)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		return nil, fmt.Errorf("starting %s: %w", pluginPath, err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		name := filepath.Base(pluginPath)
		e.mu.Lock()
		if ru.Maxrss > e.peak[name] {
			e.peak[name] = ru.Maxrss
		}
		e.mu.Unlock()
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			var perr types.Error
			if jerr := json.Unmarshal(stdout.Bytes(), &perr); jerr == nil && perr.Code != 0 {
				return nil, &perr
			}
		}
		return nil, fmt.Errorf("%s: %v: stdout %q stderr %q", pluginPath, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

func (e *rssExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *rssExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(jsonBytes)
}
