// Package link creates and inspects the links podwire plugins own: the node bridge,
// veth pairs between the node and a pod, and the sysctls that go with them. It talks to
// the kernel through vishvananda/netlink only (no `ip` exec), does single-object
// requests instead of dumps wherever the kernel allows, and treats "already exists"
// races between concurrent plugins as the normal case.
package link

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IsNotFound reports whether err says a link does not exist.
func IsNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// RandomMAC returns a random locally administered unicast MAC, as the kernel would
// pick. Choosing it ourselves means the result can report it without reading it back.
func RandomMAC() (net.HardwareAddr, error) {
	m := make(net.HardwareAddr, 6)
	if _, err := rand.Read(m); err != nil {
		return nil, fmt.Errorf("generating a MAC address: %w", err)
	}
	m[0] = (m[0] &^ 0x01) | 0x02
	return m, nil
}

// BridgeSpec is the node bridge as the configuration wants it.
type BridgeSpec struct {
	Name          string
	MTU           int // 0: kernel default
	Promisc       bool
	VlanFiltering bool
}

// EnsureBridge returns the bridge named s.Name, creating it if missing. Many ADDs may
// race to create it: the loser's EEXIST is success once the existing device is
// verified to be a bridge. A bridge we create gets accept_ra off (we own its routes)
// and is brought up; an existing one is brought up and put in promiscuous mode if the
// configuration asks. As the reference's, a new bridge has the kernel's random MAC,
// so until PinBridgeMAC it takes the lowest MAC of its ports (and all zeros with none).
//
// The bridge usually exists (every pod after the node's first), so it is looked up
// first: one request instead of a refused create plus the lookup.
func EnsureBridge(s BridgeSpec) (*netlink.Bridge, error) {
	created := false
	l, err := netlinksafe.LinkByName(s.Name)
	if IsNotFound(err) {
		if created, err = createBridge(s); err != nil {
			return nil, err
		}
		l, err = netlinksafe.LinkByName(s.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up bridge %q: %w", s.Name, err)
	}
	got, ok := l.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("device %q exists but is a %s, not a bridge: pick another \"bridge\" name in the conflist or remove the device", s.Name, l.Type())
	}
	if created {
		// Routes on the bridge are ours; a router advertisement must not add others.
		_ = WriteSysctl("net/ipv6/conf/"+s.Name+"/accept_ra", "0")
	}
	if s.Promisc && got.Promisc == 0 {
		if err := netlink.SetPromiscOn(got); err != nil {
			return nil, fmt.Errorf("setting bridge %q promiscuous: %w", s.Name, err)
		}
	}
	if got.Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(got); err != nil {
			return nil, fmt.Errorf("bringing bridge %q up: %w", s.Name, err)
		}
	}
	return got, nil
}

// createBridge creates the bridge of s; it reports false when another process created
// a device of that name first (EEXIST), which the caller then verifies.
func createBridge(s BridgeSpec) (bool, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = s.Name
	attrs.MTU = s.MTU
	br := &netlink.Bridge{LinkAttrs: attrs}
	if s.VlanFiltering {
		on := true
		br.VlanFiltering = &on
	}
	if err := netlink.LinkAdd(br); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) && s.VlanFiltering {
			return false, fmt.Errorf("creating bridge %q with VLAN filtering: %w; the kernel lacks CONFIG_BRIDGE_VLAN_FILTERING, so drop \"vlan\"/\"vlanTrunk\" or use a kernel with it", s.Name, err)
		}
		if !errors.Is(err, unix.EEXIST) {
			return false, fmt.Errorf("creating bridge %q: %w", s.Name, err)
		}
		return false, nil
	}
	return true, nil
}

// PinBridgeMAC fixes the bridge's MAC at mac, the one it had before this ADD attached
// its port, so it no longer follows its ports; all zeros (a bridge whose ports were all
// gone) becomes a random MAC. The reference does this whenever it puts a gateway
// address on the bridge (isGateway), so the gateway's MAC does not change as pods come
// and go.
func PinBridgeMAC(br netlink.Link, mac net.HardwareAddr) error {
	if len(mac) == 0 || isZeroMAC(mac) {
		var err error
		if mac, err = RandomMAC(); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetHardwareAddr(br, mac); err != nil {
		return fmt.Errorf("pinning the MAC of bridge %q at %s: %w", br.Attrs().Name, mac, err)
	}
	return nil
}

func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}

// sysctlPath turns "net/ipv4/ip_forward" into its /proc/sys path. Keys use slashes
// only: interface names may contain dots.
func sysctlPath(key string) string {
	return "/proc/sys/" + strings.TrimPrefix(key, "/")
}

// ReadSysctl reads a sysctl of the calling thread's network namespace.
func ReadSysctl(key string) (string, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// WriteSysctl writes a sysctl of the calling thread's network namespace.
func WriteSysctl(key, value string) error {
	return os.WriteFile(sysctlPath(key), []byte(value), 0o644)
}

// EnsureSysctl sets key to value unless it already has it (a read is cheaper than a
// write, which may trigger kernel work).
func EnsureSysctl(key, value string) error {
	if v, err := ReadSysctl(key); err == nil && v == value {
		return nil
	}
	if err := WriteSysctl(key, value); err != nil {
		return fmt.Errorf("setting %s=%s: %w", key, value, err)
	}
	return nil
}

// PrepareIPv6 readies ifName, in the calling thread's namespace, for IPv6 addresses as
// the reference's ipam.ConfigureIface does before it adds the first one: IPv6 is
// enabled on lo and on ifName where disable_ipv6 says otherwise (an unreadable knob is
// skipped), and keep_addr_on_down=1 keeps the addresses while ifName is down.
func PrepareIPv6(ifName string) error {
	for _, dev := range []string{"lo", ifName} {
		key := "net/ipv6/conf/" + dev + "/disable_ipv6"
		if v, err := ReadSysctl(key); err != nil || v == "0" {
			continue
		}
		if err := WriteSysctl(key, "0"); err != nil {
			return fmt.Errorf("enabling IPv6 on %s (%s=0): %w; the pod gets IPv6 addresses, so IPv6 must be available in its namespace", dev, key, err)
		}
	}
	if err := WriteSysctl("net/ipv6/conf/"+ifName+"/keep_addr_on_down", "1"); err != nil {
		return fmt.Errorf("setting keep_addr_on_down on %s: %w; the pod gets IPv6 addresses, so IPv6 must be available in its namespace", ifName, err)
	}
	return nil
}
