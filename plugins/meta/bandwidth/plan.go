// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha512"
	"encoding/hex"
	"fmt"

	"github.com/podwire/podwire/pkg/cniplumb"
	"github.com/podwire/podwire/pkg/tc"
)

const (
	// ifbPrefix starts every IFB name; the owner hash fills the other 12 of 15 bytes.
	ifbPrefix = "pwb"
	maxIfName = 15
)

// ifbName is podwire's own IFB name for an attachment: derived from network, container
// ID and interface name, so two interfaces of one pod get two IFBs. It is used when the
// reference's name (referenceIFBName) is taken by another attachment.
func ifbName(o cniplumb.Owner) (string, error) {
	return o.KernelName(ifbPrefix, maxIfName)
}

// referenceIFBName is the IFB the reference plugin creates for a container of a
// network ("bwp" and the SHA-512 of network name and container ID). An attachment's
// IFB gets this name when it is free, so the reference's DEL, which deletes it by
// name, also removes podwire's IFB after a node switches back; podwire's DEL removes
// it when it has no podwire alias (the reference made it) or this attachment's.
func referenceIFBName(network, containerID string) string {
	sum := sha512.Sum512([]byte(network + containerID))
	return ("bwp" + hex.EncodeToString(sum[:]))[:maxIfName]
}

// planShaping is the tc plan for an attachment whose host-side veth is dev with the
// given MTU, and whose IFB is ifb (see pickIFB). It is pure; req has been validated, so
// sizing errors are bugs.
func planShaping(o cniplumb.Owner, req Request, dev, ifb string, mtu int) (tc.Plan, error) {
	var err error
	p := tc.Plan{Dev: dev, MTU: mtu, IFB: ifb, Alias: tc.AliasFor(o, dev)}
	size := func(d Direction) (*tc.TBF, error) {
		if d.Rate == 0 {
			return nil, nil
		}
		t, err := tc.SizeTBF(d.Rate, d.Burst, mtu)
		if err != nil {
			return nil, fmt.Errorf("sizing the TBF for %s: %w", d, err)
		}
		return &t, nil
	}
	if p.Ingress, err = size(req.Ingress); err != nil {
		return tc.Plan{}, err
	}
	if p.Egress, err = size(req.Egress); err != nil {
		return tc.Plan{}, err
	}
	return p, nil
}
