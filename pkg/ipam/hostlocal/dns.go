// SPDX-License-Identifier: Apache-2.0

package hostlocal

import (
	"bufio"
	"io"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/cniplumb"
)

// readResolvConf reads ipam.resolvConf into the result's DNS section.
func readResolvConf(path string) (types.DNS, error) {
	f, err := os.Open(path)
	if err != nil {
		return types.DNS{}, cniplumb.ConfigError("ipam.resolvConf", "cannot read %s: %v; point it at a resolv.conf-format file or drop the key", path, err)
	}
	defer f.Close()
	dns, err := parseResolvConf(f)
	if err != nil {
		return types.DNS{}, cniplumb.ConfigError("ipam.resolvConf", "reading %s: %v", path, err)
	}
	return dns, nil
}

// parseResolvConf takes nameserver, domain, search and options lines, as the
// reference does; comments ('#' or ';') and other lines are skipped. A later domain
// line wins.
func parseResolvConf(r io.Reader) (types.DNS, error) {
	var dns types.DNS
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, f[1])
		case "domain":
			dns.Domain = f[1]
		case "search":
			dns.Search = append(dns.Search, f[1:]...)
		case "options":
			dns.Options = append(dns.Options, f[1:]...)
		}
	}
	return dns, sc.Err()
}
