package netfilter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// IPTables is the iptables backend. Every operation runs, per address family it
// touches, one `iptables -S` per feature chain (only podwire's own chains are listed,
// never a whole table, so the cost stays flat however many rules kube-proxy has) and at
// most one `iptables-restore --noflush` transaction. ip6tables is not run for a plan
// or a removal without IPv6.
type IPTables struct {
	// LockWait is how long iptables waits for the xtables lock per attempt (-w).
	LockWait time.Duration
	// Attempts is how often a command that found the xtables lock busy is run.
	Attempts int
}

// NewIPTables returns the iptables backend with default lock handling (5 s per
// attempt, 2 attempts, then a code-11 error).
func NewIPTables() *IPTables { return &IPTables{LockWait: 5 * time.Second, Attempts: 2} }

func binaries(fam Family) (list, restore string) {
	if fam == IPv6 {
		return "ip6tables", "ip6tables-restore"
	}
	return "iptables", "iptables-restore"
}

// run execs an iptables tool, retrying when the xtables lock is busy.
func (b *IPTables) run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	wait := int(b.LockWait / time.Second)
	if wait < 1 {
		wait = 1
	}
	if d := directForBinary(name); d != nil {
		out, err := d.run(stdin, strings.HasSuffix(name, "-restore"), args)
		if !errors.Is(err, errXTUnsupported) {
			return out, err
		}
	}
	args = append([]string{"-w", fmt.Sprint(wait)}, args...)
	attempts := max(b.Attempts, 1)
	var lastErr error
	for i := 0; i < attempts; i++ {
		cmd := exec.CommandContext(ctx, name, args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err == nil {
			return out.String(), nil
		}
		msg := strings.TrimSpace(errb.String())
		var ee *exec.ExitError
		if errors.As(err, &ee) && isLockBusy(ee.ExitCode(), msg) {
			lastErr = fmt.Errorf("%s: %s", name, msg)
			continue
		}
		if errors.As(err, &ee) && isMissingChain(msg) {
			return "", notFound("%s %s: %s", name, strings.Join(args, " "), msg)
		}
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), msg)
	}
	return "", busy("the xtables lock", fmt.Errorf("%w (held by another program after %d attempts of %s each)", lastErr, attempts, b.LockWait))
}

// directForBinary returns the direct iptables-nft path (xtnft_linux.go) for one of
// the iptables binaries, or nil.
func directForBinary(name string) *xtDirect {
	switch name {
	case "iptables", "iptables-restore":
		return xtDirectFor(IPv4)
	case "ip6tables", "ip6tables-restore":
		return xtDirectFor(IPv6)
	}
	return nil
}

// isLockBusy recognizes iptables' "could not get the xtables lock" failures (exit
// status 4, RESOURCE_PROBLEM).
func isLockBusy(code int, stderr string) bool {
	return code == 4 && strings.Contains(stderr, "xtables lock")
}

// isMissingChain recognizes "-S <chain>" on a chain that does not exist: legacy
// iptables says "No chain/target/match by that name", iptables-nft (1.8.x) says the
// chain "is incompatible" when the table or chain is absent.
func isMissingChain(stderr string) bool {
	return strings.Contains(stderr, "No chain/target/match by that name") ||
		strings.Contains(stderr, "does not exist") ||
		(strings.Contains(stderr, "chain `") && strings.Contains(stderr, "is incompatible"))
}

// list reads one of our chains.
func (b *IPTables) list(ctx context.Context, fam Family, f Feature, h Hook) (chainListing, error) {
	chain, err := ChainName(f, h)
	if err != nil {
		return chainListing{}, err
	}
	bin, _ := binaries(fam)
	out, err := b.run(ctx, "", bin, "-t", h.Type, "-S", chain)
	if IsNotFound(err) {
		return chainListing{}, nil
	}
	if err != nil {
		return chainListing{}, err
	}
	return parseListing(out), nil
}

func (b *IPTables) listAll(ctx context.Context, fam Family, f Feature) (map[Hook]chainListing, error) {
	ls := map[Hook]chainListing{}
	for _, h := range f.Hooks {
		l, err := b.list(ctx, fam, f, h)
		if err != nil {
			return nil, err
		}
		ls[h] = l
	}
	return ls, nil
}

// change lists f's chains in fam and runs the one restore that removes id's rules and
// adds p's (p may be nil).
func (b *IPTables) change(ctx context.Context, fam Family, f Feature, id OwnerID, p *Plan) error {
	ls, err := b.listAll(ctx, fam, f)
	if err != nil {
		return err
	}
	script, err := planIPTables(fam, f, id, p, ls, false)
	if err != nil {
		return err
	}
	if script.empty() {
		return nil
	}
	_, restore := binaries(fam)
	_, err = b.run(ctx, script.String(), restore, "--noflush")
	if err != nil && p == nil {
		// Removing the last rule also removes the chain and its entry jump; if someone
		// deleted the jump by hand that part fails. Remove just the rules then.
		if retry, perr := planIPTables(fam, f, id, p, ls, true); perr == nil && !retry.empty() {
			if _, err2 := b.run(ctx, retry.String(), restore, "--noflush"); err2 == nil {
				return nil
			}
		}
	}
	if err != nil {
		return fmt.Errorf("applying %s rules (%s): %w", f.Name, fam, err)
	}
	return nil
}

// Apply implements Backend.
func (b *IPTables) Apply(ctx context.Context, p Plan) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Feature.Bridge {
		return fmt.Errorf("feature %s needs nftables (bridge family); iptables cannot express it", p.Feature.Name)
	}
	unlock, err := lockFeature("iptables", p.Feature)
	if err != nil {
		return err
	}
	defer unlock()
	id := IDOf(p.Owner)
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		if err := b.change(ctx, fam, p.Feature, id, &p); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements Backend.
func (b *IPTables) Remove(ctx context.Context, f Feature, id OwnerID, fams Families) error {
	if f.Bridge {
		return nil
	}
	unlock, err := lockFeature("iptables", f)
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, fam := range []Family{IPv4, IPv6} {
		if fams.Has(fam) {
			errs = append(errs, b.change(ctx, fam, f, id, nil))
		}
	}
	return errors.Join(errs...)
}

// Check implements Backend. It also verifies the built-in chains still jump to ours.
func (b *IPTables) Check(ctx context.Context, p Plan) error {
	var have []string
	for _, fam := range []Family{IPv4, IPv6} {
		if !p.Families().Has(fam) {
			continue
		}
		ls, err := b.listAll(ctx, fam, p.Feature)
		if err != nil {
			return err
		}
		for h, l := range ls {
			mine := 0
			for _, r := range l.rules {
				if r.ours && r.tag.Is(p.Owner) {
					have = append(have, r.tag.Fingerprint)
					mine++
				}
			}
			if mine == 0 {
				continue
			}
			chain, _ := ChainName(p.Feature, h)
			bin, _ := binaries(fam)
			if _, err := b.run(ctx, "", bin, append([]string{"-t", h.Type, "-C"}, xtTokens(entryRule(p.Feature, h, chain))...)...); err != nil {
				return fmt.Errorf("%s %s does not jump to %s: %w; run DEL and ADD again", fam, builtinChain(h), chain, err)
			}
		}
	}
	return compareFingerprints(p, have)
}

// Tags implements Backend: both families, when their binaries exist.
func (b *IPTables) Tags(ctx context.Context, f Feature) ([]Tag, error) {
	if f.Bridge {
		return nil, nil
	}
	var out []Tag
	for _, fam := range []Family{IPv4, IPv6} {
		bin, _ := binaries(fam)
		if _, err := exec.LookPath(bin); err != nil {
			continue
		}
		ls, err := b.listAll(ctx, fam, f)
		if err != nil {
			return nil, err
		}
		for _, h := range f.Hooks {
			for _, r := range ls[h].rules {
				if r.ours {
					out = append(out, r.tag)
				}
			}
		}
	}
	return out, nil
}
