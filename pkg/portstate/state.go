// SPDX-License-Identifier: Apache-2.0

// Package portstate is portmap's marker files: one small file per attachment with host
// ports, recording what ADD installed, so that DEL, CHECK and GC (and `podwire
// inspect` and `gc --dry-run`) need neither portMappings again nor a look at the
// firewall to know an attachment has none.
package portstate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/netfilter"
)

// DefaultDir holds one small marker file per attachment that has host ports. It
// is on tmpfs (/run), so it is empty after a reboot, exactly like the rules it
// describes.
const DefaultDir = "/run/podwire/portmap"

// Marker records what ADD installed for an attachment, so that DEL, CHECK and GC need
// neither the runtime to pass portMappings again nor a look at the firewall when an
// attachment has no host ports: no marker means nothing to do.
type Marker struct {
	Owner    string             `json:"owner"`    // network/containerID/ifname, for operators
	Backend  netfilter.Kind     `json:"backend"`  // the backend ADD used
	Families netfilter.Families `json:"families"` // the address families ADD touched
	UDP4     []uint16           `json:"udp4,omitempty"`
	UDP6     []uint16           `json:"udp6,omitempty"`
	// Localnet is the interface this attachment needs route_localnet on (IPv4 with
	// snat), counted as one of its users until DEL.
	Localnet string `json:"localnet,omitempty"`
}

func MarkerOf(p netfilter.HostPortPlan, kind netfilter.Kind) Marker {
	m := Marker{Owner: p.Owner.Key(), Backend: kind, Families: p.Families()}
	seen := map[[2]uint16]bool{}
	for _, hp := range p.Ports {
		if hp.Proto != netfilter.UDP {
			continue
		}
		f := uint16(hp.Family())
		if seen[[2]uint16{f, hp.HostPort}] {
			continue
		}
		seen[[2]uint16{f, hp.HostPort}] = true
		if hp.Family() == netfilter.IPv4 {
			m.UDP4 = append(m.UDP4, hp.HostPort)
		} else {
			m.UDP6 = append(m.UDP6, hp.HostPort)
		}
	}
	return m
}

// Dir is the directory of marker files. A marker's name is
// <network hash>-<owner ID>, so GC finds a network's markers from their names.
type Dir string

func networkHash(network string) string {
	sum := sha256.Sum256([]byte(network))
	return hex.EncodeToString(sum[:4])
}

// Path is o's marker file.
func (d Dir) Path(o cniplumb.Owner) string {
	return filepath.Join(string(d), networkHash(o.Network)+"-"+string(netfilter.IDOf(o)))
}

// Write stores m for o atomically (temporary file, then rename).
func (d Dir) Write(o cniplumb.Owner, m Marker) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return cniplumb.IOError("creating portmap state directory "+string(d), err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	p := d.Path(o)
	tmp, err := os.CreateTemp(string(d), ".tmp-*")
	if err != nil {
		return cniplumb.IOError("writing portmap state for "+o.Key(), err)
	}
	_, werr := tmp.Write(b)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return cniplumb.IOError("writing portmap state for "+o.Key(), err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		_ = os.Remove(tmp.Name())
		return cniplumb.IOError("writing portmap state for "+o.Key(), err)
	}
	return nil
}

// Read returns o's marker; ok is false when there is none.
func (d Dir) Read(o cniplumb.Owner) (m Marker, ok bool, err error) {
	b, err := os.ReadFile(d.Path(o))
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, cniplumb.IOError("reading portmap state for "+o.Key(), err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		// A torn or foreign file: treat it as "installed with unknown details", so DEL
		// still removes the attachment's rules from every backend.
		return Marker{Owner: o.Key(), Families: netfilter.All}, true, nil
	}
	return m, true, nil
}

// Remove deletes o's marker; absent is success.
func (d Dir) Remove(o cniplumb.Owner) error {
	if err := os.Remove(d.Path(o)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return cniplumb.IOError("removing portmap state for "+o.Key(), err)
	}
	return nil
}

// Stored is a marker found by listing, with the file it came from and the owner
// ID its name carries.
type Stored struct {
	Marker
	File string
	ID   netfilter.OwnerID
}

// List returns the markers of network's attachments.
func (d Dir) List(network string) ([]Stored, error) {
	ents, err := os.ReadDir(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cniplumb.IOError("listing portmap state in "+string(d), err)
	}
	prefix := networkHash(network) + "-"
	var out []Stored
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		file := filepath.Join(string(d), e.Name())
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var m Marker
		if json.Unmarshal(b, &m) != nil {
			m = Marker{Families: netfilter.All}
		}
		out = append(out, Stored{Marker: m, File: file, ID: netfilter.OwnerID(strings.TrimPrefix(e.Name(), prefix))})
	}
	return out, nil
}

func (m Marker) String() string { return fmt.Sprintf("%s via %s", m.Owner, m.Backend) }

// Kinds is the backend a marker names, or both for an unreadable marker.
func (m Marker) Kinds() []netfilter.Kind {
	if m.Backend == netfilter.Auto {
		return []netfilter.Kind{netfilter.KindIPTables, netfilter.KindNFTables}
	}
	return []netfilter.Kind{m.Backend}
}

// GCKinds is the backends portmap's GC collects in: the one the configuration picks
// (configured, "" when it cannot be opened) and every one a marker names.
func GCKinds(configured netfilter.Kind, markers []Stored) []netfilter.Kind {
	var kinds []netfilter.Kind
	seen := map[netfilter.Kind]bool{}
	add := func(k netfilter.Kind) {
		if !seen[k] {
			seen[k] = true
			kinds = append(kinds, k)
		}
	}
	if configured != "" {
		add(configured)
	}
	for _, m := range markers {
		if m.Backend != netfilter.Auto {
			add(m.Backend)
		}
	}
	return kinds
}

// PlanGC returns the markers of network whose attachment valid does not hold: the
// attachments portmap's GC removes through their markers (and then the markers).
func PlanGC(markers []Stored, network string, valid cniplumb.Owners) []Stored {
	keep := map[netfilter.OwnerID]bool{}
	for o := range valid {
		if o.Network == network {
			keep[netfilter.IDOf(o)] = true
		}
	}
	var out []Stored
	for _, m := range markers {
		if !keep[m.ID] {
			out = append(out, m)
		}
	}
	return out
}

// OwnerOfKey parses a marker's Owner (network/containerID/ifname; none of the three
// has a "/").
func OwnerOfKey(key string) (cniplumb.Owner, bool) {
	f := strings.Split(key, "/")
	if len(f) != 3 {
		return cniplumb.Owner{}, false
	}
	return cniplumb.Owner{Network: f[0], ContainerID: f[1], IfName: f[2]}, true
}

// LocalnetUsers lists, per interface, the owner IDs portmap recorded as needing
// route_localnet there (dir/localnet/<ifname>/<owner ID>, kept by portmap's
// localnet), and whether portmap turned it on itself (the ".set" file).
func LocalnetUsers(dir Dir) (map[string][]netfilter.OwnerID, map[string]bool, error) {
	root := filepath.Join(string(dir), "localnet")
	ifs, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, cniplumb.IOError("listing route_localnet users in "+root, err)
	}
	users, set := map[string][]netfilter.OwnerID{}, map[string]bool{}
	for _, i := range ifs {
		if !i.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, i.Name()))
		if err != nil {
			return nil, nil, cniplumb.IOError("listing route_localnet users in "+root, err)
		}
		for _, e := range ents {
			if e.Name() == ".set" {
				set[i.Name()] = true
			} else if !strings.HasPrefix(e.Name(), ".") {
				users[i.Name()] = append(users[i.Name()], netfilter.OwnerID(e.Name()))
			}
		}
	}
	return users, set, nil
}
