// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// execXT is the xtables seam on the installed binaries: listings and -C through
// github.com/coreos/go-iptables (which also probes the binary's flavour and version,
// once per family and process), and each write as one `iptables-restore --noflush -w`,
// which go-iptables does not offer and which is what makes a change atomic.
type execXT struct {
	// lockWait is how long a tool waits for the xtables lock per attempt (-w);
	// attempts is how often a command that found the lock busy is run.
	lockWait time.Duration
	attempts int

	mu   sync.Mutex
	ipts map[Family]*iptables.IPTables
}

// hostXT is the process's one xtables seam on the installed binaries, so each family's
// binary is probed once however many backends a plugin opens.
var hostXT = sync.OnceValue(func() *execXT {
	return &execXT{lockWait: 5 * time.Second, attempts: 2, ipts: map[Family]*iptables.IPTables{}}
})

func binaries(fam Family) (list, restore string) {
	if fam == IPv6 {
		return "ip6tables", "ip6tables-restore"
	}
	return "iptables", "iptables-restore"
}

func (x *execXT) Installed(fam Family) bool {
	list, restore := binaries(fam)
	_, e1 := exec.LookPath(list)
	_, e2 := exec.LookPath(restore)
	return e1 == nil && e2 == nil
}

// ipt returns the go-iptables handle of fam, probing the binary on first use.
func (x *execXT) ipt(fam Family) (*iptables.IPTables, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h := x.ipts[fam]; h != nil {
		return h, nil
	}
	proto := map[Family]iptables.Protocol{IPv4: iptables.ProtocolIPv4, IPv6: iptables.ProtocolIPv6}[fam]
	h, err := iptables.New(iptables.IPFamily(proto), iptables.Timeout(int(x.lockWait/time.Second)))
	if err != nil {
		list, _ := binaries(fam)
		return nil, fmt.Errorf("probing %s: %w; install iptables or configure the nftables backend", list, err)
	}
	x.ipts[fam] = h
	return h, nil
}

// retry runs op until it succeeds or fails for another reason than a busy xtables
// lock; a lock still busy after every attempt is a code-11 error naming what waited.
func (x *execXT) retry(what string, op func() error) error {
	var err error
	for i := 0; i < max(x.attempts, 1); i++ {
		if err = op(); err == nil || !isLockBusy(err) {
			return err
		}
	}
	return busy("the xtables lock", fmt.Errorf("%s: %w (held by another program after %d attempts of %s each)", what, err, x.attempts, x.lockWait))
}

// withIPT runs op on fam's go-iptables handle, retried while the lock is busy.
func (x *execXT) withIPT(fam Family, what string, op func(h *iptables.IPTables) error) error {
	h, err := x.ipt(fam)
	if err != nil {
		return err
	}
	return x.retry(what, func() error { return op(h) })
}

func (x *execXT) List(ctx context.Context, fam Family, table, chain string) (lines []string, exists bool, err error) {
	what := fmt.Sprintf("listing %s %s chain %s", fam, table, chain)
	err = x.withIPT(fam, what, func(h *iptables.IPTables) (err error) { lines, err = h.List(table, chain); return err })
	if isMissingChain(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", what, err)
	}
	return lines, true, nil
}

func (x *execXT) Has(ctx context.Context, fam Family, table, chain string, rule []string) (ok bool, err error) {
	what := fmt.Sprintf("checking %s %s chain %s", fam, table, chain)
	err = x.withIPT(fam, what, func(h *iptables.IPTables) (err error) { ok, err = h.Exists(table, chain, rule...); return err })
	if isMissingChain(err) {
		return false, nil // a rule jumping to a chain that does not exist is not there
	}
	return ok, err
}

func (x *execXT) Restore(ctx context.Context, fam Family, script string) error {
	_, restore := binaries(fam)
	wait := strconv.Itoa(max(int(x.lockWait/time.Second), 1))
	return x.retry(restore, func() error {
		cmd := exec.CommandContext(ctx, restore, "--noflush", "-w", wait)
		cmd.Stdin = strings.NewReader(script)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil {
			msg := strings.TrimSpace(errb.String())
			if msg == "" {
				msg = err.Error()
			}
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() == 4 && strings.Contains(msg, "xtables lock") {
				return &lockBusyError{msg}
			}
			return fmt.Errorf("%s --noflush: %s", restore, msg)
		}
		return nil
	})
}

// lockBusyError is iptables-restore's "could not get the xtables lock".
type lockBusyError struct{ msg string }

func (e *lockBusyError) Error() string { return e.msg }

// isLockBusy recognizes the xtables lock held by someone else past -w's wait (exit
// status 4, RESOURCE_PROBLEM, from iptables, ip6tables and their -restore tools).
func isLockBusy(err error) bool {
	var lb *lockBusyError
	if errors.As(err, &lb) {
		return true
	}
	var ie *iptables.Error
	return errors.As(err, &ie) && ie.ExitStatus() == 4 && strings.Contains(ie.Error(), "xtables lock")
}

// isMissingChain recognizes a listing or -C of a chain that does not exist: legacy
// iptables says "No chain/target/match by that name", iptables-nft (1.8.x) that the
// chain "is incompatible" when its table or chain is absent; and a -C of a rule whose
// target chain does not exist (iptables-legacy: "Couldn't load target").
func isMissingChain(err error) bool {
	var ie *iptables.Error
	if !errors.As(err, &ie) {
		return false
	}
	msg := ie.Error()
	return strings.Contains(msg, "No chain/target/match by that name") || strings.Contains(msg, "Couldn't load target") ||
		strings.Contains(msg, "does not exist") ||
		(strings.Contains(msg, "chain `") && strings.Contains(msg, "is incompatible"))
}
