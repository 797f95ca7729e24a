// SPDX-License-Identifier: Apache-2.0

// Command podwire is the node operator's view of podwire's CNI plugins: it finds the
// networks as runtimes do and reads each one's own state (leases, veths, host-port
// and masquerade rules, qdiscs and IFBs, portmap's markers) through the plugins' own
// packages. See README.md.
//
//	podwire inspect  [--network N] [--json]
//	podwire gc       --dry-run | --valid ID/IFNAME... | --cri SOCKET | --all  [--network N]
//	podwire validate CONFLIST|DIR...
//	podwire doctor   [--cri SOCKET] [--json]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/podwire/podwire/pkg/cniplumb"
)

const usage = `usage: podwire COMMAND [flags]

commands:
  inspect   one row per attachment (addresses, host veth, hostPorts, masquerade, qdiscs, IFB, leases) and orphans
  gc        what GC would remove (--dry-run), or run it through libcni
  validate  check conflists: unknown keys, shapes, missing plugins, duplicate names, cniVersion
  doctor    check the node: iptables, nftables, br_netfilter, ip_forward, KUBE-MARK-MASQ, the runtime

every command finds networks as runtimes do: conflists in $NETCONFPATH or /etc/cni/net.d,
plugins in $CNI_PATH or /opt/cni/bin; "podwire COMMAND -h" lists its flags.
`

// errFindings is returned by commands that ran but found problems: exit status 1
// without a further message.
var errFindings = errors.New("problems found")

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmds := map[string]func([]string, io.Writer) error{
		"inspect":  runInspect,
		"gc":       runGC,
		"validate": runValidate,
		"doctor":   runDoctor,
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version":
		fmt.Fprintln(stdout, "podwire", cniplumb.Version)
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "podwire: unknown command %q\n%s", args[0], usage)
		return 2
	}
	err := cmd(args[1:], stdout)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errFindings):
		return 1
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "podwire %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(stderr, "podwire %s: %v\n", args[0], err)
	return 1
}

// usageError is a wrong command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("podwire "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}
