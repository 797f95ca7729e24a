// SPDX-License-Identifier: Apache-2.0

// Package cniplumb is the CNI plumbing every podwire plugin shares: wiring of the six
// verbs through skel, validation of the CNI_* environment and the network name with
// messages that name the bad value, version negotiation and result conversion, and the
// spec's error codes. Plugins never unmarshal stdin or print results themselves.
package cniplumb

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"

	cnins "github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"
)

// Version is the podwire release, set at build time with
// -ldflags "-X github.com/podwire/podwire/pkg/cniplumb.Version=...".
var Version = "dev"

// BuildStamp identifies the podwire sources a binary was built from. `make build` sets
// it for every plugin to "podwire-build:" and a hash of the Go sources, go.mod and
// go.sum (-ldflags "-X github.com/podwire/podwire/pkg/cniplumb.BuildStamp=..."). It is
// empty in a plain `go build`, and then no plugin runs another in its own process.
// Only the linker sets it; code reads it from Input.BuildStamp, which Main fills and
// tests pass as they need.
var BuildStamp string

// DefaultRunDir holds podwire's small per-boot state (locks, caches); it is a tmpfs on
// systemd hosts, so nothing in it survives a reboot. Main passes it as Input.RunDir.
const DefaultRunDir = "/run/podwire"

// SupportedVersions are the cniVersions a podwire plugin accepts unless its Verbs
// say otherwise: those of the CNI library's version.All, 0.1.0 to 1.1.0, as the
// reference plugins accept. A configuration without cniVersion is 0.1.0, as skel and
// libcni read it. A result at 0.1.0 or 0.2.0 is the library's types/020 (ip4, ip6,
// dns: no interfaces), converted from the 1.x result as the reference's is. CHECK
// needs 0.4.0 and GC and STATUS 1.1.0 whatever the plugin accepts (skel refuses them
// below with code 1, as the spec says).
var SupportedVersions = version.All.SupportedVersions()

// Verbs are a plugin's implementations of the CNI operations. A nil Check, GC or
// Status succeeds without doing anything; Add and Del are required.
type Verbs struct {
	Add    func(ctx context.Context, in *Input) (types.Result, error)
	Del    func(ctx context.Context, in *Input) error
	Check  func(ctx context.Context, in *Input) error
	GC     func(ctx context.Context, in *Input) error
	Status func(ctx context.Context, in *Input) error

	// Versions are the cniVersions the plugin accepts, in ascending order; nil means
	// SupportedVersions. A plugin whose reference counterpart accepts fewer (bandwidth:
	// 0.3.0 and later) lists the same, so both refuse the same configurations.
	Versions []string
}

// versions is what v accepts.
func (v Verbs) versions() []string {
	if v.Versions != nil {
		return v.Versions
	}
	return SupportedVersions
}

// Main runs the plugin named name and exits. On failure it prints the CNI error as
// JSON on stdout and exits 1; a panic becomes a code-999 error, never a Go trace on
// stdout (the trace goes to stderr for the operator's logs).
func Main(name string, v Verbs) {
	oneProc()
	if err := run(name, v, os.Getenv); err != nil {
		if perr := err.Print(); perr != nil {
			fmt.Fprintf(os.Stderr, "%s: writing error to stdout: %v\n", name, perr)
		}
		os.Exit(1)
	}
}

func run(name string, v Verbs, env func(string) string) *types.Error {
	cmd := env("CNI_COMMAND")
	info := version.PluginSupports(v.versions()...)
	about := fmt.Sprintf("CNI plugin %s (podwire %s)", name, Version)
	if BuildStamp != "" {
		// Also keeps the stamp in every binary, where Delegator looks for it.
		about = fmt.Sprintf("CNI plugin %s (podwire %s, %s)", name, Version, BuildStamp)
	}

	var logConf LogConf
	switch cmd {
	case "ADD", "DEL", "CHECK", "GC", "STATUS":
		if err := preflightEnv(cmd, env); err != nil {
			stdin := stdinUnlessTerminal()
			logRefusal(name, cmd, env, readLogConf(stdin), stdin, err)
			return toCNIError(err)
		}
		stdin, err := io.ReadAll(io.LimitReader(os.Stdin, maxStdin+1))
		if err != nil {
			return toCNIError(IOError("reading network configuration from stdin", err))
		}
		if len(stdin) > maxStdin {
			return toCNIError(DecodeError("network configuration", fmt.Errorf("stdin is larger than %d bytes", maxStdin)))
		}
		lc, err := preflightConf(stdin, v.versions())
		if err != nil {
			logRefusal(name, cmd, env, lc, stdin, err)
			return toCNIError(err)
		}
		logConf = lc
		// skel reads stdin itself; hand it the bytes we already consumed.
		if err := replaceStdin(stdin); err != nil {
			return toCNIError(IOError("buffering stdin", err))
		}
	}

	sc := newSignalContext()
	defer sc.release()
	var ctx context.Context = sc

	funcs := skel.CNIFuncs{
		Add: wrap(ctx, name, env, logConf, func(ctx context.Context, in *Input) (types.Result, error) {
			if v.Add == nil {
				return nil, fmt.Errorf("%s does not implement ADD", name)
			}
			res, err := v.Add(ctx, in)
			if err != nil {
				return nil, err
			}
			if res == nil {
				return nil, fmt.Errorf("%s returned no result from ADD", name)
			}
			return res, nil
		}),
		Del:    wrap(ctx, name, env, logConf, noResult(v.Del)),
		Check:  wrap(ctx, name, env, logConf, noResult(v.Check)),
		GC:     wrap(ctx, name, env, logConf, noResult(v.GC)),
		Status: wrap(ctx, name, env, logConf, noResult(v.Status)),
	}
	return skel.PluginMainFuncsWithError(funcs, info, about)
}

// maxStdin bounds the configuration we accept; real conflists with prevResult are a few
// kilobytes.
const maxStdin = 4 << 20

// noResult adapts a verb without a result (nil: one that does nothing) to wrap.
func noResult(f func(context.Context, *Input) error) func(context.Context, *Input) (types.Result, error) {
	return func(ctx context.Context, in *Input) (types.Result, error) {
		if f == nil {
			return nil, nil
		}
		return nil, f(ctx, in)
	}
}

// wrap adapts a verb to skel: it parses the shared input, opens the verb's log (when
// the network configuration asks for one), prints ADD's result in the configuration's
// cniVersion, turns panics into code-999 errors and keeps CNI codes through %w
// wrapping. The log's final line is written after all of that, panics included.
func wrap(ctx context.Context, name string, env func(string) string, lc LogConf, f func(context.Context, *Input) (types.Result, error)) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) (err error) {
		var cl *CallLog
		var res types.Result
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintf(os.Stderr, "%s: panic: %v\n%s", name, r, debug.Stack())
				err = types.NewError(CodeInternal, fmt.Sprintf("internal error in %s", name),
					fmt.Sprintf("panic: %v (this is a bug in podwire; the stack trace is on stderr)", r))
			}
			cl.finish(res, err)
		}()
		cmd := env("CNI_COMMAND")
		in, err := parseInput(cmd, env, args.StdinData)
		if err != nil {
			logRefusal(name, cmd, env, lc, args.StdinData, err)
			return err
		}
		cl = newCallLog(name, lc, cmd, env, in.Conf)
		res, err = f(WithLog(ctx, cl), in)
		if err != nil {
			return toCNIError(err)
		}
		if res != nil {
			if err := types.PrintResult(res, in.Conf.CNIVersion); err != nil {
				return fmt.Errorf("converting result to cniVersion %q: %w", in.Conf.CNIVersion, err)
			}
		}
		return nil
	}
}

// logRefusal logs a verb refused before it ran (bad environment, configuration or
// cniVersion), when the configuration could be read far enough to name a log file.
func logRefusal(name, cmd string, env func(string) string, lc LogConf, stdin []byte, err error) {
	if lc.File == "" && lc.Problem == "" {
		return
	}
	var conf types.PluginConf
	_ = json.Unmarshal(stdin, &conf) // best effort: only names the network in the line
	cl := newCallLog(name, lc, cmd, env, conf)
	cl.finish(nil, err)
}

// stdinUnlessTerminal reads stdin for a verb refused before stdin was read, so the
// refusal can be logged; a terminal (an operator trying the binary by hand) is not
// waited on. A runtime always writes the configuration and closes the pipe.
func stdinUnlessTerminal() []byte {
	if st, err := os.Stdin.Stat(); err != nil || st.Mode()&os.ModeCharDevice != 0 {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(os.Stdin, maxStdin))
	return b
}

// readLogConf reads only the log keys of stdin, for a verb refused before the rest of
// the configuration was checked.
func readLogConf(stdin []byte) LogConf {
	var r rawLogConf
	if json.Unmarshal(stdin, &r) != nil {
		return LogConf{}
	}
	return parseLogConf(r)
}

// preflightEnv validates the CNI_* variables the command needs, with messages that
// name the bad value and what is allowed.
func preflightEnv(cmd string, env func(string) string) error {
	perAttachment := cmd == "ADD" || cmd == "DEL" || cmd == "CHECK"
	if env("CNI_PATH") == "" {
		return EnvError("CNI_PATH", "CNI_PATH is not set; the runtime must pass the plugin search path")
	}
	if !perAttachment {
		return nil
	}
	if msg := checkID("container ID", env("CNI_CONTAINERID")); msg != "" {
		return EnvError("CNI_CONTAINERID", "%s", msg)
	}
	if msg := checkIfName(env("CNI_IFNAME")); msg != "" {
		return EnvError("CNI_IFNAME", "%s", msg)
	}
	netns := env("CNI_NETNS")
	if netns == "" {
		if cmd == "DEL" {
			return nil // the spec allows DEL without a netns
		}
		return EnvError("CNI_NETNS", "CNI_NETNS is not set; %s needs the path of the container's network namespace", cmd)
	}
	if msg := checkNetnsPath(netns); msg != "" {
		return EnvError("CNI_NETNS", "%s", msg)
	}
	if cmd != "DEL" {
		if _, err := os.Stat(netns); err != nil {
			return EnvError("CNI_NETNS", "network namespace %q cannot be used: %v; the runtime must create it before %s", netns, err, cmd)
		}
	}
	// skel makes the same check only after ADD has done its work and printed a result;
	// refuse before touching anything.
	if o := env("CNI_NETNS_OVERRIDE"); o != "1" && !strings.EqualFold(o, "true") {
		if same, err := cnins.CheckNetNS(netns); err != nil {
			return err
		} else if same {
			return types.NewError(types.ErrInvalidNetNS, "invalid CNI_NETNS",
				fmt.Sprintf("%q is the plugin's own network namespace, not a container's; pass the container's namespace", netns))
		}
	}
	return nil
}

// replaceStdin points os.Stdin at an in-memory copy of data.
func replaceStdin(data []byte) error {
	fd, err := unix.MemfdCreate("cni-stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing stdin copy: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return fmt.Errorf("rewinding stdin copy: %w", err)
	}
	os.Stdin = f
	return nil
}

// oneProc runs the plugin's Go code on one processor unless GOMAXPROCS says otherwise.
// A verb is a few milliseconds of mostly system calls; its goroutines overlap waits on
// the kernel, which a blocked system call does without holding the processor. A
// second processor only adds threads that spin looking for work: on a node starting
// many pods at once, each plugin used ~7% more CPU and the pods took longer.
func oneProc() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}
