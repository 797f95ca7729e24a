// SPDX-License-Identifier: Apache-2.0

// Package nstest is podwire's integration-test harness: it builds the plugins once,
// gives each test fresh "host" and "pod" network namespaces with a unique name prefix,
// drives the built binaries through libcni exactly as containerd and CRI-O do, and
// removes everything it made when the test ends, even on failure.
package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// RepoRoot is the directory holding go.mod.
func RepoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the podwire module")
	}
	return filepath.Dir(mod), nil
}

// BinDir builds every plugin under plugins/ into a temporary directory (once per test
// binary) and returns it. PODWIRE_BIN_DIR, when set, is used instead (e.g. `make
// build` output, or an unpacked release tarball).
func BinDir() (string, error) {
	buildOnce.Do(func() {
		if d := os.Getenv("PODWIRE_BIN_DIR"); d != "" {
			binDir = d
			return
		}
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "podwire-bin-")
		if err != nil {
			buildErr = err
			return
		}
		// Stamped like `make build`, so bridge runs host-local in-process as it does
		// when installed.
		stamp := fmt.Sprintf("-X github.com/podwire/podwire/pkg/cniplumb.BuildStamp=podwire-build:test-%d-%d", os.Getpid(), time.Now().UnixNano())
		cmd := exec.Command("go", "build", "-ldflags="+stamp, "-o", dir+"/", "./plugins/...")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building plugins: %v\n%s", err, out)
			return
		}
		binDir = dir
	})
	return binDir, buildErr
}

// CleanupBinDir removes the directory BinDir built into; call it from TestMain.
func CleanupBinDir() {
	if binDir != "" && os.Getenv("PODWIRE_BIN_DIR") == "" {
		os.RemoveAll(binDir)
	}
}
