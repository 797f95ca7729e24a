// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
	"fmt"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// Backend installs, checks and removes the rules of attachments in one layout (see
// the package doc). P is the layout's plan; R is what removal knows of an attachment
// besides its owner. Apply and Remove are atomic per address family (one
// `iptables-restore --noflush` per family, or one nftables batch).
type Backend[P, R any] interface {
	// Apply installs p. An invalid plan fails before anything changes.
	Apply(ctx context.Context, p P) error
	// Check reports an error when the owner's rules differ from p: missing, extra or
	// changed; IsNotFound tells the missing case.
	Check(ctx context.Context, p P) error
	// Remove deletes o's rules. Nothing to remove is success, as CNI DEL requires.
	Remove(ctx context.Context, o Owner, known R) error
	// GC removes the rules of every attachment of network that keep does not hold.
	GC(ctx context.Context, network string, keep cniplumb.Owners) error
}

// Kind names a backend in configuration ("ipMasqBackend", portmap's "backend").
type Kind string

const (
	Auto         Kind = ""
	KindIPTables Kind = "iptables"
	KindNFTables Kind = "nftables"
)

// Named reports whether k names a backend (as opposed to Auto).
func (k Kind) Named() bool { return k == KindNFTables || k == KindIPTables }

// ParseKind validates a configured backend name; key names the config key for the
// error. "" means auto.
func ParseKind(key, s string) (Kind, error) {
	switch Kind(s) {
	case Auto, KindIPTables, KindNFTables:
		return Kind(s), nil
	}
	return "", cniplumb.ConfigError(key, "%q is not a netfilter backend; use \"iptables\", \"nftables\" or leave it out to pick automatically", s)
}

// Probe is what the host offers, as found by ProbeHost.
type Probe struct {
	IPTables bool // iptables-restore (and iptables) are installed
	NFTables bool // the kernel answers nf_tables netlink requests
}

// Pick chooses the backend for want given the probe. Auto prefers nftables (no exec,
// a table of our own), falling back to iptables on kernels without nf_tables;
// portmap's and ipMasq's automatic choices follow the reference instead (OpenHostPorts,
// PickMasq). A backend asked for by name but missing is a code-50 error telling the
// operator what to install or configure.
func Pick(want Kind, p Probe) (Kind, error) {
	switch want {
	case KindIPTables:
		if !p.IPTables {
			return "", cniplumb.NotAvailable("the iptables backend was configured but iptables-restore is not installed; install iptables or configure \"nftables\"")
		}
		return KindIPTables, nil
	case KindNFTables:
		if !p.NFTables {
			return "", cniplumb.NotAvailable("the nftables backend was configured but the kernel does not answer nf_tables requests; load nf_tables or configure \"iptables\"")
		}
		return KindNFTables, nil
	case Auto:
		if p.NFTables {
			return KindNFTables, nil
		}
		if p.IPTables {
			return KindIPTables, nil
		}
		return "", cniplumb.NotAvailable("neither nftables (kernel nf_tables) nor iptables (iptables-restore) is usable on this node; install iptables or enable nf_tables")
	}
	return "", fmt.Errorf("unknown netfilter backend %q", want)
}

// Error kinds, tested with the predicates below (through %w wrapping).
var (
	errNotFound = errors.New("not found")
	errBusy     = errors.New("busy")
)

// IsNotFound reports whether err says a rule, chain or table does not exist.
func IsNotFound(err error) bool { return errors.Is(err, errNotFound) }

// IsBusy reports whether err is a lock still held after retrying (the xtables lock);
// such errors also carry CNI code 11 so the runtime retries.
func IsBusy(err error) bool { return errors.Is(err, errBusy) }

// kindError wraps err so that errors.Is(err, kind) holds and the message stays err's.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func notFound(format string, a ...any) error {
	return &kindError{kind: errNotFound, err: fmt.Errorf(format, a...)}
}

// wrapf is err with what failed in front (format and a), or nil when err is.
func wrapf(err error, format string, a ...any) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(format+": %w", append(a, err)...)
}

// busy marks err as a persistent lock and gives it code 11.
func busy(what string, err error) error {
	return &kindError{kind: errBusy, err: cniplumb.TryAgain(what, err)}
}
