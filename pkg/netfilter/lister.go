// SPDX-License-Identifier: Apache-2.0

package netfilter

import (
	"context"
	"errors"
)

// Lister reads every layout's Objects in every backend the node offers: what `podwire
// inspect`, `podwire gc --dry-run` (through Stale) and the agent's reclaim counter
// read, through the listings and functions the backends' GC runs (objects.go). It
// changes nothing and takes none of podwire's locks.
type Lister struct {
	probe func() Probe
	xt    XTables
	s     *nftSocket
}

// NewListerOn reads the given seams (a fake kernel in tests) as a node that offers
// both backends.
func NewListerOn(xt XTables, nc NFTConn) *Lister {
	return &Lister{probe: func() Probe { return Probe{IPTables: true, NFTables: true} }, xt: xt, s: nftSocketOn(nc)}
}

// forBackends runs fn for each backend p offers, nftables first, and joins the
// errors, each naming its backend.
func forBackends(p Probe, fn func(Kind) error) error {
	var errs []error
	for _, k := range []Kind{KindNFTables, KindIPTables} {
		if k == KindNFTables && p.NFTables || k == KindIPTables && p.IPTables {
			errs = append(errs, wrapf(fn(k), "%s", k))
		}
	}
	return errors.Join(errs...)
}

// List returns every attachment's rules: masquerade, host ports (with the reference
// portmap's cni_hostport) and macspoofchk, nftables first.
func (l *Lister) List(ctx context.Context) ([]Object, error) {
	var out []Object
	err := forBackends(l.probe(), func(k Kind) error {
		var errs []error
		if k == KindNFTables {
			for _, x := range []struct {
				l    *nftLayout
				what string
			}{{masqLayout(), "masquerade"}, {featureLayout(HostPortFeature), "hostports"}, {spoofLayout(), "macspoof"}} {
				objs, err := x.l.list(l.s, x.what)
				out, errs = append(out, objs...), append(errs, err)
			}
			c, done, err := l.s.conn()
			if err != nil {
				return errors.Join(append(errs, err)...)
			}
			ref, err := readRefHP(c)
			done()
			out = append(out, refHPObjects(ref)...)
			return errors.Join(append(errs, err)...)
		}
		x := xtLayout{xt: l.xt}
		for _, fam := range All.list() {
			if !l.xt.Installed(fam) {
				continue
			}
			post, err := x.list(ctx, fam, masqPostrouting)
			errs = append(errs, err)
			masq := masqXTObjects(fam, post.rules)
			for i := range masq {
				own, err := x.list(ctx, fam, masq[i].Key)
				errs = append(errs, err)
				for _, r := range own.rules {
					masq[i].Rules = append(masq[i].Rules, r.line)
				}
			}
			top, err := x.list(ctx, fam, HostPortDNATChain)
			out, errs = append(append(out, masq...), hpXTObjects(fam, top)...), append(errs, err)
		}
		return errors.Join(errs...)
	})
	return out, err
}
