// SPDX-License-Identifier: Apache-2.0

// Package testenv is how podwire's tests react to what the machine lacks. A test that
// cannot run here says why: on a developer's machine that is a skip, under CI=true
// (.ci/run exports it and installs every tool the tests need, as root) it is a
// failure, so CI cannot go green without running a test. The only skip CI allows is a
// feature the running kernel was built without, and that skip names the kernel option.
package testenv

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// CI reports whether the tests run under CI (CI is set and not "false" or "0").
func CI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false" && v != "0"
}

// Missing reports a tool, package, privilege or download the test needs but cannot
// have: a skip on a developer's machine, a failure under CI=true (a missing tool there
// is a broken CI script, and tests proving compatibility with the reference must never
// quietly not run).
func Missing(t testing.TB, format string, a ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("under CI=true: "+format, a...)
	}
	t.Skipf(format, a...)
}

// RequireRoot ends the test (Missing) unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root to create network namespaces, links and mounts; run `sudo make test` (CI runs as root)")
	}
}

// KernelLacks ends a test whose probe of a kernel feature failed (why says how). It
// skips, even under CI, only when the running kernel's configuration shows one of
// options (e.g. "CONFIG_BRIDGE_VLAN_FILTERING") is not built: "is not set" or absent,
// as Kconfig leaves out an option whose dependencies are off. An option built as a
// module is loaded with modprobe's help by the test itself, or it is Missing. When the
// configuration says every option is built, or it cannot be read (no /proc/config.gz,
// no /boot/config-<release>), the failure is not the kernel's: Missing.
func KernelLacks(t testing.TB, why string, options ...string) {
	t.Helper()
	conf, where, err := kernelConfig()
	if err != nil {
		Missing(t, "%s; cannot tell whether the kernel lacks %s: %v", why, strings.Join(options, " or "), err)
		return
	}
	if o, modules := lacking(conf, options); o != "" {
		t.Skipf("the running kernel is built without %s (%s): %s", o, where, why)
		return
	} else if len(modules) > 0 {
		Missing(t, "%s, though the kernel has %s (%s): is the module loaded?", why, strings.Join(modules, ", "), where)
		return
	}
	Missing(t, "%s, though the kernel is built with %s (%s)", why, strings.Join(options, ", "), where)
}

// lacking returns the first of options conf does not build, else the options it
// builds as modules (as "CONFIG_X=m").
func lacking(conf map[string]string, options []string) (option string, modules []string) {
	for _, o := range options {
		switch conf[o] {
		case "y":
		case "m":
			modules = append(modules, o+"=m")
		default:
			return o, nil
		}
	}
	return "", modules
}

// kernelConfig reads the running kernel's build configuration as option -> value
// ("y", "m", a string or number); options "is not set" are absent.
func kernelConfig() (map[string]string, string, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, "", fmt.Errorf("uname: %w", err)
	}
	release := string(bytes.TrimRight(uts.Release[:], "\x00"))
	var errs []string
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err == nil {
			return parseConfig(zr), "/proc/config.gz", nil
		}
		errs = append(errs, fmt.Sprintf("/proc/config.gz: %v", err))
	} else {
		errs = append(errs, err.Error())
	}
	path := "/boot/config-" + release
	f, err := os.Open(path)
	if err != nil {
		errs = append(errs, err.Error())
		return nil, "", fmt.Errorf("no kernel configuration: %s", strings.Join(errs, "; "))
	}
	defer f.Close()
	return parseConfig(f), path, nil
}

func parseConfig(r io.Reader) map[string]string {
	conf := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := sc.Text()
		if k, v, ok := strings.Cut(l, "="); ok && strings.HasPrefix(k, "CONFIG_") {
			conf[k] = strings.Trim(v, `"`)
		}
	}
	return conf
}
