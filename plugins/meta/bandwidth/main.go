// SPDX-License-Identifier: Apache-2.0

// Command bandwidth is podwire's drop-in replacement for the reference bandwidth plugin:
// a chained plugin that shapes a pod's traffic in both directions with token bucket
// filters on the host side of its veth (see README.md for keys, formulas and accuracy).
package main

import (
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

// sinceV030 are the cniVersions bandwidth accepts: from 0.3.0, as the reference's
// bandwidth (version.VersionsStartingFrom("0.3.0")), where the other plugins accept
// 0.1.0 and 0.2.0 too.
var sinceV030 = version.VersionsStartingFrom("0.3.0").SupportedVersions()

func main() {
	s := &shaper{tc: tc.NewNetlink(nil), hostVeth: findHostVeth, probe: tc.Probe}
	cniplumb.Main("bandwidth", cniplumb.Verbs{Add: s.add, Del: s.del, Check: s.check, GC: s.gc, Status: s.status,
		Versions: sinceV030})
}
