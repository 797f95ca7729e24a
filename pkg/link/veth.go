package link

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// VethSpec is one pod's veth pair.
type VethSpec struct {
	PodIfName string           // CNI_IFNAME, the end inside the pod
	PodNSFd   int              // an open fd of the pod's network namespace
	PodMAC    net.HardwareAddr // nil: random
	MTU       int              // 0: kernel default
	BridgeIdx int              // the host end is enslaved to this bridge at creation
}

// Veth is a created pair.
type Veth struct {
	Host    *netlink.Veth // in the node's namespace, on the bridge, up
	HostMAC net.HardwareAddr
	PodMAC  net.HardwareAddr // the pod end is down; the caller configures it
}

// hostVethName is "veth" plus 8 random hex digits: 4 billion names, and a collision
// only costs a retry.
func hostVethName() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating a veth name: %w", err)
	}
	return "veth" + hex.EncodeToString(b[:]), nil
}

// defaultTxQueueLen is the kernel's txqueuelen for a new veth (DEFAULT_TX_QUEUE_LEN).
const defaultTxQueueLen = 1000

// ErrPodIfExists means the pod already has an interface with the requested name.
var ErrPodIfExists = errors.New("interface already exists in the pod's network namespace")

// CreateVeth creates the pair from the node's namespace with one request: the pod end
// is created directly inside the pod's namespace under its final name, the host end
// gets a generated name and joins the bridge. Both MACs are chosen here so the result
// needs no read-back. When the generated host name is taken it retries with another;
// when the pod name is taken it fails with ErrPodIfExists.
func CreateVeth(s VethSpec, podHasLink func(name string) bool) (*Veth, error) {
	podMAC := s.PodMAC
	var err error
	if podMAC == nil {
		if podMAC, err = RandomMAC(); err != nil {
			return nil, err
		}
	}
	for attempt := 0; attempt < 8; attempt++ {
		name, err := hostVethName()
		if err != nil {
			return nil, err
		}
		hostMAC, err := RandomMAC()
		if err != nil {
			return nil, err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = name
		attrs.MTU = s.MTU
		attrs.HardwareAddr = hostMAC
		attrs.Flags = net.FlagUp
		attrs.MasterIndex = s.BridgeIdx
		// The txqueuelens of the reference's pair, which it creates from the pod's side
		// with the library's defaults: the pod end gets the kernel's veth default
		// (DEFAULT_TX_QUEUE_LEN, 1000) and the peer, here the host end, an explicit 0.
		// The library sends the peer's length whenever it is not negative, falling back
		// to the main end's, so both are set here.
		attrs.TxQLen = 0
		v := &netlink.Veth{LinkAttrs: attrs, PeerName: s.PodIfName, PeerHardwareAddr: podMAC,
			PeerNamespace: netlink.NsFd(s.PodNSFd), PeerTxQLen: defaultTxQueueLen}
		if s.MTU > 0 {
			v.PeerMTU = uint32(s.MTU)
		}
		err = netlink.LinkAdd(v)
		if errors.Is(err, unix.EEXIST) {
			if podHasLink(s.PodIfName) {
				return nil, fmt.Errorf("creating veth for pod interface %q: %w", s.PodIfName, ErrPodIfExists)
			}
			continue // our generated host name was taken
		}
		if err != nil {
			// netlink may have created the pair and failed only to enslave it.
			if l, lerr := netlink.LinkByName(name); lerr == nil {
				_ = netlink.LinkDel(l)
			}
			if errors.Is(err, unix.EADDRNOTAVAIL) && s.PodMAC != nil {
				return nil, fmt.Errorf("creating veth pair %s/%s: the kernel rejects MAC %s (multicast or all-zero); pass a unicast MAC: %w", name, s.PodIfName, s.PodMAC, err)
			}
			return nil, fmt.Errorf("creating veth pair %s/%s: %w", name, s.PodIfName, err)
		}
		// As the reference: the node owns the routes through the host end, so router
		// advertisements must not add any. Absent when IPv6 is disabled, which is fine.
		_ = WriteSysctl("net/ipv6/conf/"+name+"/accept_ra", "0")
		return &Veth{Host: v, HostMAC: hostMAC, PodMAC: podMAC}, nil
	}
	return nil, fmt.Errorf("creating veth for %q: 8 generated host names were all taken", s.PodIfName)
}

// PortSpec is the bridge-port configuration of a pod's host veth.
type PortSpec struct {
	Hairpin             bool
	Isolated            bool
	Vlan                int   // access VLAN (PVID, untagged); 0: none
	Trunk               []int // tagged VLANs
	PreserveDefaultVlan bool  // keep the bridge's default PVID on the port
	DefaultPVID         uint16
}

// ConfigurePort applies s to the host veth; a fresh port already has hairpin and
// isolation off, so only what differs from the defaults costs a request.
func ConfigurePort(l netlink.Link, s PortSpec) error {
	name := l.Attrs().Name
	if s.Hairpin {
		if err := netlink.LinkSetHairpin(l, true); err != nil {
			return fmt.Errorf("enabling hairpin on %s: %w", name, err)
		}
	}
	if s.Isolated {
		if err := netlink.LinkSetIsolated(l, true); err != nil {
			return fmt.Errorf("isolating port %s: %w", name, err)
		}
	}
	if s.Vlan == 0 && len(s.Trunk) == 0 {
		return nil
	}
	if !s.PreserveDefaultVlan {
		// A new port holds only the bridge's default PVID; removing it is what the
		// reference does by listing every port's VLANs, without the dump.
		pvid := s.DefaultPVID
		if pvid == 0 {
			pvid = 1
		}
		if err := netlink.BridgeVlanDel(l, pvid, true, true, false, true); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing default VLAN %d from %s: %w", pvid, name, err)
		}
	}
	if s.Vlan != 0 {
		if err := netlink.BridgeVlanAdd(l, uint16(s.Vlan), true, true, false, true); err != nil {
			return fmt.Errorf("setting VLAN %d on %s: %w", s.Vlan, name, err)
		}
	}
	for _, v := range s.Trunk {
		if err := netlink.BridgeVlanAdd(l, uint16(v), false, false, false, true); err != nil {
			return fmt.Errorf("adding trunk VLAN %d to %s: %w", v, name, err)
		}
	}
	if s.Vlan == 0 && len(s.Trunk) > 0 {
		// As the reference: a trunk without an access VLAN keeps VLAN 1 native.
		if err := netlink.BridgeVlanAdd(l, 1, true, true, false, true); err != nil {
			return fmt.Errorf("setting native VLAN 1 on %s: %w", name, err)
		}
	}
	return nil
}

// DeleteByName deletes the named link of the calling thread's namespace; a missing link
// is success.
func DeleteByName(name string) error {
	l, err := netlink.LinkByName(name)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking up %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}
