// SPDX-License-Identifier: Apache-2.0

package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/podwire/podwire/integration/nstest"
)

// lan is one L2 segment: a bridge in a switch namespace of its own, and every host
// attached to it by a veth (its end in the host is named lan0).
type lan struct {
	t      *testing.T
	h      *nstest.H // for names and commands
	sw     ns.NetNS
	bridge string
	n      int
}

func newLAN(t *testing.T, h *nstest.H) *lan {
	sw, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sw.Close(); _ = testutils.UnmountNS(sw) })
	l := &lan{t: t, h: h, sw: sw, bridge: h.Name("sw")}
	h.Run(sw, "ip", "link", "add", l.bridge, "type", "bridge")
	h.Run(sw, "ip", "link", "set", l.bridge, "up")
	return l
}

// attach connects netns n with address cidr on its lan0 and brings its lo up.
func (l *lan) attach(n ns.NetNS, cidr string) {
	l.n++
	port := fmt.Sprintf("%sp%d", l.h.Prefix, l.n)
	l.h.Run(l.sw, "ip", "link", "add", port, "type", "veth", "peer", "name", "lan0", "netns", n.Path())
	l.h.Run(l.sw, "ip", "link", "set", port, "master", l.bridge, "up")
	l.h.Run(n, "ip", "addr", "add", cidr, "dev", "lan0")
	l.h.Run(n, "ip", "link", "set", "lan0", "up")
	l.h.Run(n, "ip", "link", "set", "lo", "up")
}

// waitLANUp waits until n's lan0 has its carrier and an IPv6 link-local address:
// the kernel reports a new veth's carrier asynchronously (linkwatch, up to a second
// later), and the link-local address only follows it, so a snapshot taken right after
// attach could see either change land afterwards.
func waitLANUp(t *testing.T, h *nstest.H, n ns.NetNS) {
	t.Helper()
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		link := h.Run(n, "ip", "-o", "link", "show", "dev", "lan0")
		out = link + h.Run(n, "ip", "-o", "-6", "addr", "show", "dev", "lan0", "scope", "link")
		if !strings.Contains(link, "NO-CARRIER") && strings.Contains(link, "state UP") && strings.Contains(out, "fe80::") {
			return
		}
	}
	t.Fatalf("lan0 not up with a link-local address after 10s:\n%s", out)
}

// newNetNS is a namespace removed at cleanup.
func newNetNS(t *testing.T) ns.NetNS {
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(); _ = testutils.UnmountNS(n) })
	return n
}

// peerEcho listens on addr:port inside netns n and answers every connection with the
// address it came from, as the listener's kernel saw it (after any NAT on the way).
func peerEcho(t *testing.T, n ns.NetNS, addr string) string {
	var l net.Listener
	if err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(addr, "0"))
		return err
	}); err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, n.Path(), err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			fmt.Fprintln(c, host)
			c.Close()
		}
	}()
	return l.Addr().String()
}

// seenAs connects from netns n to a peerEcho and returns the source address it saw.
func seenAs(n ns.NetNS, target string) (string, error) {
	var line string
	err := n.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", target, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	if err != nil {
		return "", fmt.Errorf("connecting from %s to %s: %w", n.Path(), target, err)
	}
	return strings.TrimSpace(line), nil
}

// nsGet fetches url from inside netns n.
func nsGet(n ns.NetNS, url string) (int, string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := n.Do(func(ns.NetNS) error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metricValue is the value of the first sample of name whose labels contain every one
// of labels ("k=\"v\""), from Prometheus's text format; ok is false when there is none.
func metricValue(text, name string, labels ...string) (v float64, ok bool) {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, val, found := strings.Cut(line, " ")
		if !found || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(series, l)
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); match && err == nil {
			return f, true
		}
	}
	return 0, false
}

// agentProc is a podwire-agent running in a node's namespace.
type agentProc struct {
	cmd  *exec.Cmd
	log  string
	done chan error
}

// startAgent runs bin in netns n with args; cleanup stops it. Its output goes to a file
// printed when the test fails.
func startAgent(t *testing.T, n ns.NetNS, name, bin string, args ...string) *agentProc {
	a := &agentProc{log: filepath.Join(t.TempDir(), name+".log"), done: make(chan error, 1)}
	f, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command("nsenter", append([]string{"--net=" + n.Path(), bin}, args...)...)
	a.cmd.Stdout, a.cmd.Stderr = f, f
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() { a.done <- a.cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		a.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(a.log)
			t.Logf("%s's output:\n%s", name, b)
		}
	})
	return a
}

// stop sends SIGTERM and waits (SIGKILL after 20 s); it is idempotent. An agent that
// had already exited is reported with its exit status.
func (a *agentProc) stop(t *testing.T) {
	if a.done == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("agent exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		t.Errorf("agent did not stop within 20 s of SIGTERM")
	}
	a.done = nil
}

// eventually polls f every 200 ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
