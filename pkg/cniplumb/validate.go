// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"fmt"
	"path/filepath"
	"strings"
	"unicode"
)

// maxIfNameLen is IFNAMSIZ-1: the kernel's limit on an interface name.
const maxIfNameLen = 15

// maxIDLen bounds container IDs and network names. The spec sets no limit, but a
// megabyte "container ID" is an attack, not a container; runtimes use 64 hex digits.
const maxIDLen = 1024

// validIDRule is what the spec allows for container IDs and network names, in words.
const validIDRule = `allowed are letters, digits, "_", "." and "-", starting with a letter or digit`

// checkID validates a container ID or network name against the spec's rule
// ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$. It returns a description of the problem, or "".
func checkID(what, v string) string {
	if v == "" {
		return what + " is empty"
	}
	if len(v) > maxIDLen {
		return fmt.Sprintf("%s is %d bytes long; at most %d are allowed", what, len(v), maxIDLen)
	}
	for i, r := range v {
		ok := r < unicode.MaxASCII && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		if i > 0 && (r == '_' || r == '.' || r == '-') {
			ok = true
		}
		if !ok {
			return fmt.Sprintf("%s %q has %s at position %d; %s", what, v, describeRune(r), i, validIDRule)
		}
	}
	return ""
}

// checkIfName validates an interface name: 1-15 bytes, not "." or "..", and no "/",
// ":", whitespace or control characters (the kernel's dev_valid_name, plus ":" which
// the spec forbids for aliases).
func checkIfName(v string) string {
	switch {
	case v == "":
		return "interface name is empty"
	case len(v) > maxIfNameLen:
		return fmt.Sprintf("interface name %q is %d bytes long; Linux allows at most %d", v, len(v), maxIfNameLen)
	case v == "." || v == "..":
		return fmt.Sprintf("interface name %q is not allowed", v)
	}
	for i, r := range v {
		if r == '/' || r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Sprintf("interface name %q has %s at position %d; \"/\", \":\", whitespace and control characters are not allowed", v, describeRune(r), i)
		}
	}
	return ""
}

// checkNetnsPath validates CNI_NETNS when it is given: an absolute, clean path.
func checkNetnsPath(v string) string {
	if !filepath.IsAbs(v) {
		return fmt.Sprintf("network namespace path %q is not absolute; pass a path such as /var/run/netns/<name> or /proc/<pid>/ns/net", v)
	}
	if strings.ContainsRune(v, 0) {
		return "network namespace path contains a NUL byte"
	}
	return ""
}

func describeRune(r rune) string {
	if unicode.IsPrint(r) {
		return fmt.Sprintf("%q", r)
	}
	return fmt.Sprintf("character %U", r)
}
