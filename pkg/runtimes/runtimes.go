// SPDX-License-Identifier: Apache-2.0

// Package runtimes knows what each CRI runtime's CNI layer can do: the highest CNI spec
// version its vendored libcni accepts in a conflist, and whether it ever calls the STATUS
// and GC verbs. The agent asks the runtime for its name and version over the CRI Version
// RPC (RuntimeName, RuntimeVersion) and picks the conflist's cniVersion and its own GC
// schedule from this table.
//
// Everything here is pure: no CRI, no files. Facts and where they come from (module
// versions read from each release's go.mod on the Go module proxy, December 2026):
//
// containerd (RuntimeName "containerd"):
//   - 1.6.x vendors containerd/go-cni v1.1.3..v1.1.6 with containernetworking/cni
//     (libcni) v1.1.x (v1.6.20, Debian 12's containerd: go-cni v1.1.6, libcni v1.1.1).
//     libcni v1.1 knows spec versions up to 1.0.0 and refuses a conflist with
//     cniVersion 1.1.0 ("unsupported CNI version"), so 1.0.0 is the highest.
//   - 1.7.x vendors go-cni v1.1.9 with libcni v1.1.2: highest 1.0.0.
//   - 2.0.0 vendors go-cni v1.1.10 with libcni v1.2.3: libcni v1.2 accepts 1.1.0, but
//     go-cni v1.1.10's Status() does not call STATUS (GetStatusNetworkList arrived in
//     go-cni v1.1.11, vendored from containerd 2.0.1; 2.0.3+ and 2.1 have v1.1.12, 2.4
//     has v1.1.14 with libcni v1.3.1).
//   - No release calls GC: go-cni has no GC method (containerd/go-cni#131 is open) and
//     containerd/containerd#12130 tracks it. The agent must drive GC itself.
//
// CRI-O (RuntimeName "cri-o"):
//   - up to 1.30 vendors cri-o/ocicni v0.4.x with libcni v1.1.2: highest 1.0.0, no STATUS,
//     no GC.
//   - 1.31 and later vendor ocicni v0.4.3+ (STATUS: cri-o/ocicni#196, GC: cri-o/ocicni#197)
//     with libcni v1.2: highest 1.1.0, STATUS on the CRI Status call (cri-o/cri-o#8018),
//     GC once at startup for pods it could not restore (cri-o/cri-o#8245). v1.34.0 is on
//     the module proxy (ocicni v0.4.3, libcni v1.3.0) and integration/crio runs it: STATUS
//     is polled until it passes once, GC runs at startup (TestCRIOStatus, TestCRIOStartupGC).
//
// Anything else (or a version that does not parse) gets the conservative answer: 1.0.0,
// no STATUS, no GC, so the agent drives GC and a conflist never needs a newer libcni.
package runtimes

import (
	"strconv"
	"strings"
)

// GCPolicy says when a runtime calls the CNI GC verb on its own.
type GCPolicy int

const (
	// GCNever: the runtime never calls GC; leaked objects stay until someone else does.
	GCNever GCPolicy = iota
	// GCAtStartup: the runtime calls GC once when it starts, never again.
	GCAtStartup
	// GCPeriodic: the runtime calls GC on its own schedule.
	GCPeriodic
)

func (p GCPolicy) String() string {
	switch p {
	case GCNever:
		return "never"
	case GCAtStartup:
		return "at-startup"
	case GCPeriodic:
		return "periodic"
	}
	return "unknown"
}

// Capabilities is what a runtime's CNI layer does with a conflist.
type Capabilities struct {
	// Known is false when the runtime or version is not in the table; the other fields
	// are then the conservative defaults.
	Known bool
	// MaxCNIVersion is the highest conflist cniVersion the runtime's libcni accepts.
	MaxCNIVersion string
	// CallsStatus: the runtime's CRI Status call runs the chain's STATUS verb.
	CallsStatus bool
	// GC: when the runtime calls the chain's GC verb by itself.
	GC GCPolicy
	// Source names the row that matched, for logs ("containerd 1.6.x").
	Source string
}

// Conservative is the answer for an unknown runtime.
var Conservative = Capabilities{MaxCNIVersion: "1.0.0", GC: GCNever, Source: "unknown runtime"}

// Version is a parsed runtime version. Only major.minor.patch matter for the table.
type Version struct{ Major, Minor, Patch int }

// ParseVersion reads "v1.6.20", "1.6.20~ds1", "2.0.0-rc.1+unknown" and the like: an
// optional "v", then up to three dot-separated numbers; anything after the digits of the
// last number read is ignored. ok is false without at least major.minor.
func ParseVersion(s string) (v Version, ok bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	var nums []int
	for len(nums) < 3 {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 {
			break
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return Version{}, false
		}
		nums = append(nums, n)
		s = s[i:]
		if !strings.HasPrefix(s, ".") {
			break
		}
		s = s[1:]
	}
	if len(nums) < 2 {
		return Version{}, false
	}
	v.Major, v.Minor = nums[0], nums[1]
	if len(nums) == 3 {
		v.Patch = nums[2]
	}
	return v, true
}

// AtLeast reports v >= major.minor.patch.
func (v Version) AtLeast(major, minor, patch int) bool {
	if v.Major != major {
		return v.Major > major
	}
	if v.Minor != minor {
		return v.Minor > minor
	}
	return v.Patch >= patch
}

// Lookup returns what the runtime named by the CRI Version RPC can do.
func Lookup(runtimeName, runtimeVersion string) Capabilities {
	v, ok := ParseVersion(runtimeVersion)
	if !ok {
		return Conservative
	}
	switch strings.ToLower(strings.TrimSpace(runtimeName)) {
	case "containerd":
		return containerd(v)
	case "cri-o", "crio":
		return crio(v)
	}
	return Conservative
}

func containerd(v Version) Capabilities {
	switch {
	case !v.AtLeast(1, 6, 0):
		return Conservative
	case !v.AtLeast(2, 0, 0):
		return Capabilities{Known: true, MaxCNIVersion: "1.0.0", GC: GCNever,
			Source: "containerd 1.6/1.7 (libcni v1.1)"}
	case !v.AtLeast(2, 0, 1):
		return Capabilities{Known: true, MaxCNIVersion: "1.1.0", GC: GCNever,
			Source: "containerd 2.0.0 (libcni v1.2, go-cni v1.1.10 without STATUS)"}
	}
	return Capabilities{Known: true, MaxCNIVersion: "1.1.0", CallsStatus: true, GC: GCNever,
		Source: "containerd 2.0.1+ (libcni v1.2+, go-cni v1.1.11+)"}
}

func crio(v Version) Capabilities {
	switch {
	case !v.AtLeast(1, 20, 0):
		return Conservative
	case !v.AtLeast(1, 31, 0):
		return Capabilities{Known: true, MaxCNIVersion: "1.0.0", GC: GCNever,
			Source: "CRI-O up to 1.30 (libcni v1.1)"}
	}
	return Capabilities{Known: true, MaxCNIVersion: "1.1.0", CallsStatus: true, GC: GCAtStartup,
		Source: "CRI-O 1.31+ (libcni v1.2, ocicni GC/STATUS)"}
}

// CNIVersion is the cniVersion the agent writes for the runtime: the highest the runtime
// accepts, capped by what podwire's plugins support (1.1.0).
func CNIVersion(runtimeName, runtimeVersion string) string {
	return Lookup(runtimeName, runtimeVersion).MaxCNIVersion
}

// AgentMustGC reports whether the agent has to run GC periodically itself: true unless
// the runtime already calls GC on its own schedule.
func AgentMustGC(c Capabilities) bool { return c.GC != GCPeriodic }
