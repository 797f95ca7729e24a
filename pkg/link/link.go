// SPDX-License-Identifier: Apache-2.0

// Package link is the link work of podwire's bridge plugin behind a small Backend
// interface (backend.go): the node bridge, one veth pair per pod, the pod interface's
// addresses, routes and sysctls, the gateway addresses and node sysctls. Netlink
// (netlink_linux.go) talks to the kernel through vishvananda/netlink only (no `ip`
// exec), with single-object requests wherever the kernel allows; Fake (fake.go) models
// the kernel for unit tests that need no root.
package link

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// isKernelNotFound reports the kernel's and netlink's answers for a missing link.
func isKernelNotFound(err error) bool {
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

// sysctlPath turns "net/ipv4/ip_forward" into its /proc/sys path. Keys use slashes
// only: interface names may contain dots.
func sysctlPath(key string) string {
	return "/proc/sys/" + strings.TrimPrefix(key, "/")
}

// readSysctl reads a sysctl of the calling thread's network namespace.
func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// ensureSysctl sets key to value unless it already has it (a read is cheaper than a
// write, which may trigger kernel work), in the calling thread's namespace.
func ensureSysctl(key, value string) error {
	if v, err := readSysctl(key); err == nil && v == value {
		return nil
	}
	if err := os.WriteFile(sysctlPath(key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s=%s: %w", key, value, err)
	}
	return nil
}
