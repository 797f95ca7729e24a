// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// This file binds the backends to the real kernel: the iptables binaries, nf_tables
// netlink sockets and the lock files in LockDir.

// LockDir holds podwire's netfilter lock files. A lock serializes podwire's own
// read-modify-write cycles per backend and layout (list our chains, then change them),
// so two plugins never decide on the same stale listing; other programs are not held.
var LockDir = "/run/podwire"

// lockNamed takes LockDir/<name>.lock.
func lockNamed(name string) (unlock func(), err error) {
	if err := os.MkdirAll(LockDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating lock directory %s: %w", LockDir, err)
	}
	return LockFile(filepath.Join(LockDir, name+".lock"))
}

// lockWait bounds the wait for a lock: podwire holds its netfilter locks for
// milliseconds, so a longer wait means a stuck process, and the runtime should retry.
var lockWait = time.Minute

// LockFile takes an exclusive flock on path (created 0600 if missing, never through a
// symlink); unlock releases it, and so does the process's death, even by SIGKILL. A
// lock still held after lockWait is a code-11 error.
func LockFile(path string) (unlock func(), err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), lockWait)
	defer cancel()
	if err := cniplumb.Flock(ctx, fd); err != nil {
		unix.Close(fd)
		if ctx.Err() != nil {
			return nil, busy("podwire's lock "+path, fmt.Errorf("held by another process for %s", lockWait))
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}

// hostXTLayout is an iptables layout on the installed binaries, with its lock file.
func hostXTLayout(layout string) xtLayout {
	return xtLayout{hostXT(), func() (func(), error) { return lockNamed("iptables-" + layout) }}
}

// nftBuf is the send and receive buffer of podwire's nf_tables sockets. A batch is one
// message, which must fit the send buffer, and the kernel answers each message of it
// (google/nftables asks for an acknowledgement of each and an echo of each new rule)
// before the plugin reads: with the default buffers a few hundred rules fail
// (EMSGSIZE, ENOBUFS). 64 MiB holds some 30,000 rules (2,000 dual-stack host ports on
// one pod); the memory is used only while a batch or its answers wait.
const nftBuf = 64 << 20

// dialNFT opens a lasting nf_tables socket in the current network namespace.
func dialNFT() (*nftables.Conn, error) {
	return nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetOption(netlink.CapAcknowledge, true); err != nil {
			return err
		}
		raw, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			// The FORCE variants need CAP_NET_ADMIN (which a plugin has) and pass
			// net.core.[rw]mem_max.
			serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, nftBuf),
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftBuf))
		}); err != nil {
			return err
		}
		if serr != nil {
			return errors.Join(c.SetWriteBuffer(nftBuf), c.SetReadBuffer(nftBuf))
		}
		return nil
	}))
}

// hostNFTSocket is a lasting nf_tables socket in the network namespace of its first
// use, with podwire's lock files.
func hostNFTSocket() *nftSocket {
	s := &nftSocket{lock: lockNamed}
	s.dial = func() (NFTConn, error) {
		c, err := dialNFT()
		if err != nil {
			return nil, err
		}
		s.close = c.CloseLasting
		return c, nil
	}
	return s
}

// NewNFTables returns the backend of podwire's own nftables tables on the kernel.
func NewNFTables() *NFTables { return &NFTables{s: hostNFTSocket()} }

// ProbeHost finds which backends this host offers: nftables when the kernel answers
// an nf_tables request, iptables when iptables and iptables-restore are installed. It
// costs one netlink round trip and two PATH lookups.
func ProbeHost() Probe {
	var p Probe
	if c, err := nftables.New(); err == nil {
		if _, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
			p.NFTables = true
		}
	}
	p.IPTables = hostXT().Installed(IPv4)
	return p
}

// namedProbe is what a backend configured by name needs probed: nftables reports a
// kernel without nf_tables at its first netlink call; iptables needs iptables-restore.
// Any other kind (Auto) gets an empty Probe: callers probe the host for it.
func namedProbe(want Kind) Probe {
	var p Probe
	switch want {
	case KindNFTables:
		p.NFTables = true
	case KindIPTables:
		_, err := exec.LookPath("iptables-restore")
		p.IPTables = err == nil
	}
	return p
}

// OpenHostPorts returns the host-port backend for want and the kind it chose. Auto
// picks what the reference portmap picks with "backend" unset (iptables when installed,
// else nftables), because the reference's DEL only looks in its own default backend:
// a node that switches back to the reference under live pods must find their rules
// there. "nftables" is the faster, exec-free choice. A backend asked for by name but
// missing is a code-50 error.
func OpenHostPorts(want Kind) (HostPortBackend, Kind, error) {
	nft, k, err := NewNFTables(), want, error(nil)
	switch {
	case want.Named():
		k, err = Pick(want, namedProbe(want))
	case hostXT().Installed(IPv4):
		k = KindIPTables
	case nftUsable(nft):
		k = KindNFTables
	default:
		_, err = Pick(Auto, Probe{})
	}
	if err != nil {
		return nil, "", err
	}
	if k == KindIPTables {
		return &HostPortIPTables{hostXTLayout("hostport")}, k, nil
	}
	return &HostPortNFTables{nft: nft}, k, nil
}

// nftUsable reports whether the kernel answers nf_tables requests, asked on b's own
// socket.
func nftUsable(b *NFTables) bool {
	c, done, err := b.s.conn()
	if err != nil {
		return false
	}
	defer done()
	_, err = c.ListTableOfFamily("filter", nftables.TableFamilyINet)
	return err == nil || isNoEnt(err)
}

// NewLister reads the node's kernel.
func NewLister() *Lister { return &Lister{probe: ProbeHost, xt: hostXT(), s: hostNFTSocket()} }

// NewMacSpoof returns macspoofchk's backend on the kernel (the reference's layout).
func NewMacSpoof() *MacSpoof { return &MacSpoof{s: hostNFTSocket()} }
