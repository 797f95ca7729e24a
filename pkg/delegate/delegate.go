// SPDX-License-Identifier: Apache-2.0

// Package delegate runs delegated plugins (IPAM plugins named in ipam.type): executed
// from CNI_PATH as the CNI library's invoke.Delegate* does (exec.go), or, when the file found is podwire's own
// build of a plugin whose verbs the caller links in, in the caller's process. It is a
// package of its own so that only plugins that delegate link debug/buildinfo.
package delegate

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Delegator runs a delegated plugin (the IPAM plugin named in ipam.type) as
// invoke.Delegate* does: the first file of that name in CNI_PATH, with this call's
// environment and stdin and CNI_COMMAND set to the verb. When Builtin holds verbs for
// that plugin and the file is podwire's own build of it from the same sources (see
// sameBuild), the verbs run in this process instead: the same code on the same input
// with the same result and errors, without starting a second process.
type Delegator struct {
	Builtin map[string]Builtin // by plugin name
}

// Builtin is a plugin this binary can run in-process.
type Builtin struct {
	Verbs cniplumb.Verbs
	// Package is the Go main package the plugin's own binary is built from, e.g.
	// "github.com/podwire/podwire/plugins/ipam/host-local".
	Package string
}

// Add delegates ADD. The result is in the configuration's cniVersion, as an executed
// plugin's would be.
func (d Delegator) Add(ctx context.Context, in *cniplumb.Input, plugin string) (types.Result, error) {
	v, ok := d.local(in, plugin)
	cniplumb.Log(ctx).Decision("ipam", "plugin", plugin, "inProcess", ok && v.Add != nil)
	if !ok || v.Add == nil {
		return execAdd(ctx, plugin, in.Stdin)
	}
	var res types.Result
	err := runLocal(plugin, func() error {
		r, err := v.Add(ctx, as(in, "ADD"))
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("%s returned no result from ADD", plugin)
		}
		if res, err = r.GetAsVersion(in.Conf.CNIVersion); err != nil {
			return fmt.Errorf("converting result to cniVersion %s: %w", in.Conf.CNIVersion, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Del delegates DEL.
func (d Delegator) Del(ctx context.Context, in *cniplumb.Input, plugin string) error {
	v, ok := d.local(in, plugin)
	if !ok {
		_, err := execPlugin(ctx, plugin, "DEL", in.Stdin)
		return err
	}
	return runLocal(plugin, func() error { return orNoop(v.Del)(ctx, as(in, "DEL")) })
}

// Check delegates CHECK.
func (d Delegator) Check(ctx context.Context, in *cniplumb.Input, plugin string) error {
	v, ok := d.local(in, plugin)
	if !ok {
		_, err := execPlugin(ctx, plugin, "CHECK", in.Stdin)
		return err
	}
	return runLocal(plugin, func() error { return orNoop(v.Check)(ctx, as(in, "CHECK")) })
}

// GC delegates GC.
func (d Delegator) GC(ctx context.Context, in *cniplumb.Input, plugin string) error {
	v, ok := d.local(in, plugin)
	if !ok {
		_, err := execPlugin(ctx, plugin, "GC", in.Stdin)
		return err
	}
	return runLocal(plugin, func() error { return orNoop(v.GC)(ctx, as(in, "GC")) })
}

// Status delegates STATUS.
func (d Delegator) Status(ctx context.Context, in *cniplumb.Input, plugin string) error {
	v, ok := d.local(in, plugin)
	if !ok {
		_, err := execPlugin(ctx, plugin, "STATUS", in.Stdin)
		return err
	}
	return runLocal(plugin, func() error { return orNoop(v.Status)(ctx, as(in, "STATUS")) })
}

// InProcess reports whether plugin would run in this process for in.
func (d Delegator) InProcess(in *cniplumb.Input, plugin string) bool {
	_, ok := d.local(in, plugin)
	return ok
}

// as is the input the delegated plugin would parse from the same environment and stdin.
func as(in *cniplumb.Input, cmd string) *cniplumb.Input {
	c := *in
	c.Command = cmd
	return &c
}

func orNoop(f func(context.Context, *cniplumb.Input) error) func(context.Context, *cniplumb.Input) error {
	if f == nil {
		return func(context.Context, *cniplumb.Input) error { return nil }
	}
	return f
}

// runLocal runs a builtin verb the way Main would in its own process: a panic is a
// code-999 error, and every error reaches the caller as the *types.Error the plugin
// would have printed.
func runLocal(plugin string, f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "%s: panic: %v\n%s", plugin, r, debug.Stack())
			err = types.NewError(cniplumb.CodeInternal, fmt.Sprintf("internal error in %s", plugin),
				fmt.Sprintf("panic: %v (this is a bug in podwire; the stack trace is on stderr)", r))
		}
	}()
	if e := f(); e != nil {
		return cniplumb.AsCNIError(e)
	}
	return nil
}

func (d Delegator) local(in *cniplumb.Input, plugin string) (cniplumb.Verbs, bool) {
	b, ok := d.Builtin[plugin]
	if !ok || in.BuildStamp == "" {
		return cniplumb.Verbs{}, false
	}
	path, err := findPlugin(plugin, filepath.SplitList(in.Path))
	if err != nil {
		return cniplumb.Verbs{}, false // executing it reports the error
	}
	return b.Verbs, sameBuild(in, path, b.Package)
}

// sameBuild reports whether the file at path is an executable built from the same
// podwire sources (in.BuildStamp), by the same Go release, as the Go main package pkg. The
// verdict is cached in in.RunDir per file identity (device, inode, size, mtime, ctime), so
// only the first call after the file changed reads it.
func sameBuild(in *cniplumb.Input, path, pkg string) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o111 == 0 {
		return false // executing it reports what is wrong
	}
	stamp := in.BuildStamp
	return in.Verdicts().File("delegate-"+filepath.Base(path), path,
		stamp+" "+runtime.Version()+" "+pkg, func() bool { return readSameBuild(path, pkg, stamp) })
}

func readSameBuild(path, pkg, stamp string) bool {
	b, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(b, []byte(stamp)) {
		return false
	}
	bi, err := buildinfo.Read(bytes.NewReader(b))
	return err == nil && bi.Path == pkg && bi.GoVersion == runtime.Version()
}
