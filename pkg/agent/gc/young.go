// SPDX-License-Identifier: Apache-2.0

package gc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podwire/podwire/pkg/ipam"
	"github.com/podwire/podwire/pkg/ipam/disk"
)

// DefaultGrace is how long after its lease was written an attachment is kept by GC
// whatever the runtime says. containerd lists a sandbox only once its ADD has returned,
// so a GC between host-local's lease and the end of that ADD would release the address
// of a pod being created, and hand it to the next one. An ADD waits at most a minute
// for podwire's locks; a pod that leaked in its first minutes is reclaimed a period
// later.
const DefaultGrace = 3 * time.Minute

// Young returns the attachments of network whose host-local lease under dataDir is
// younger than grace at now, read through host-local's own store (under its lock, as
// a plugin call reads it). A missing network directory has none.
func Young(ctx context.Context, dataDir, network string, grace time.Duration, now time.Time) ([]types.GCAttachment, error) {
	if grace <= 0 {
		return nil, nil
	}
	st, err := disk.Open(dataDir, network, disk.Options{})
	if err != nil {
		return nil, err
	}
	if !st.Exists() {
		return nil, nil
	}
	var leases []ipam.Lease
	if err := st.Do(ctx, func(tx ipam.Tx) (err error) {
		leases, err = tx.All()
		return err
	}); err != nil {
		return nil, err
	}
	var out []types.GCAttachment
	for _, l := range leases {
		if l.Owner.ContainerID == "" || l.IP == nil {
			continue
		}
		fi, err := os.Lstat(filepath.Join(st.Dir(), l.IP.String()))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if now.Sub(fi.ModTime()) < grace {
			out = append(out, types.GCAttachment{ContainerID: l.Owner.ContainerID, IfName: l.Owner.IfName})
		}
	}
	return out, nil
}
