package main

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

// defaultStateDir holds one small marker file per attachment that has host ports. It
// is on tmpfs (/run), so it is empty after a reboot, exactly like the rules it
// describes.
const defaultStateDir = "/run/podwire/portmap"

// marker records what ADD installed for an attachment, so that DEL, CHECK and GC need
// neither the runtime to pass portMappings again nor a look at the firewall when an
// attachment has no host ports: no marker means nothing to do.
type marker struct {
	Owner    string             `json:"owner"`    // network/containerID/ifname, for operators
	Backend  netfilter.Kind     `json:"backend"`  // the backend ADD used
	Families netfilter.Families `json:"families"` // the address families ADD touched
	UDP4     []uint16           `json:"udp4,omitempty"`
	UDP6     []uint16           `json:"udp6,omitempty"`
	// Localnet is the interface this attachment needs route_localnet on (IPv4 with
	// snat), counted as one of its users until DEL.
	Localnet string `json:"localnet,omitempty"`
}

func markerOf(p netfilter.HostPortPlan, kind netfilter.Kind) marker {
	m := marker{Owner: p.Owner.Key(), Backend: kind, Families: p.Families()}
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

// stateDir is the directory of marker files. A marker's name is
// <network hash>-<owner ID>, so GC finds a network's markers from their names.
type stateDir string

func networkHash(network string) string {
	sum := sha256.Sum256([]byte(network))
	return hex.EncodeToString(sum[:4])
}

func (d stateDir) path(o cniplumb.Owner) string {
	return filepath.Join(string(d), networkHash(o.Network)+"-"+string(netfilter.IDOf(o)))
}

// write stores m for o atomically (temporary file, then rename).
func (d stateDir) write(o cniplumb.Owner, m marker) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return cniplumb.IOError("creating portmap state directory "+string(d), err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	p := d.path(o)
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

// read returns o's marker; ok is false when there is none.
func (d stateDir) read(o cniplumb.Owner) (m marker, ok bool, err error) {
	b, err := os.ReadFile(d.path(o))
	if errors.Is(err, fs.ErrNotExist) {
		return m, false, nil
	}
	if err != nil {
		return m, false, cniplumb.IOError("reading portmap state for "+o.Key(), err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		// A torn or foreign file: treat it as "installed with unknown details", so DEL
		// still removes the attachment's rules from every backend.
		return marker{Owner: o.Key(), Families: netfilter.All}, true, nil
	}
	return m, true, nil
}

// remove deletes o's marker; absent is success.
func (d stateDir) remove(o cniplumb.Owner) error {
	if err := os.Remove(d.path(o)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return cniplumb.IOError("removing portmap state for "+o.Key(), err)
	}
	return nil
}

// storedMarker is a marker found by listing, with the file it came from and the owner
// ID its name carries.
type storedMarker struct {
	marker
	file string
	id   netfilter.OwnerID
}

// list returns the markers of network's attachments.
func (d stateDir) list(network string) ([]storedMarker, error) {
	ents, err := os.ReadDir(string(d))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cniplumb.IOError("listing portmap state in "+string(d), err)
	}
	prefix := networkHash(network) + "-"
	var out []storedMarker
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		file := filepath.Join(string(d), e.Name())
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var m marker
		if json.Unmarshal(b, &m) != nil {
			m = marker{Families: netfilter.All}
		}
		out = append(out, storedMarker{marker: m, file: file, id: netfilter.OwnerID(strings.TrimPrefix(e.Name(), prefix))})
	}
	return out, nil
}

func (m marker) String() string { return fmt.Sprintf("%s via %s", m.Owner, m.Backend) }
