// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/podwire/podwire/integration/containerd"
	"github.com/podwire/podwire/integration/crio"
)

// A node with Runtime "crio" runs CRI-O as integration/crio builds and configures it
// (v1.34.0 from the Go module proxy, cgroupfs, a runc handler with Debian's conmon,
// every path of its own below one directory), here below the node's dir and inside the
// node's network and mount namespaces, so it sees the node's /etc/cni/net.d and
// /opt/cni/bin as podwire-agent fills them.

// crioPaths is where a CRI-O node keeps everything: below <node dir>/crio, except its
// socket, which is at the packaged path in the node's /run/crio bind (also below the
// node's dir), where the kubelet and deploy/'s podwire-agent look for it.
func (n Node) crioPaths() crio.Paths {
	ps := crio.PathsIn(n.Path("crio"))
	ps.Socket = crioSocket
	return ps
}

// crictlConfig is the crictl config naming n's CRI-O, read from the machine: the socket
// through the node's bind source.
func (n Node) crictlConfig() string { return n.Path("crio", "crictl.yaml") }

// ensureCRIO fills p.CRIODir and p.Crictl when a node runs CRI-O: the build of
// integration/crio (cached in .cache/crio) and the Debian packages it runs with.
func ensureCRIO(p *Plan) error {
	if !p.HasRuntime(RuntimeCRIO) {
		return nil
	}
	if missing := crio.Missing(); len(missing) > 0 {
		return fmt.Errorf("a CRI-O node (RUNTIMES) needs %v: apt-get install %s", missing, strings.Join(missing, " "))
	}
	bin, err := crio.EnsureCRIO(p.Repo)
	if err != nil {
		return err
	}
	p.CRIODir = bin.Dir
	p.Crictl, err = containerd.EnsureCrictl(p.Repo)
	return err
}

// startCRIO writes n's CRI-O config, puts the images into its storage, makes the node's
// 127.0.0.1 hostPorts work as docs/crio.md tells an operator, starts CRI-O and waits for
// its CRI.
func (s *State) startCRIO(n Node, images []ImageArchive) error {
	p := s.Plan
	ps := n.crioPaths()
	for _, dir := range []string{ps.Root, ps.RunRoot, ps.NamespacesDir, ps.ExitsDir, ps.AttachDir, ps.LogDir, ps.Tmp,
		ps.HooksDir, ps.CDIDir, ps.KeysDir, filepath.Join(ps.Dir, "conf.d"), filepath.Dir(ps.VersionFilePers)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	runtime, err := crio.RuntimePath(p.Repo, ps.Dir)
	if err != nil {
		return err
	}
	cfg, err := crio.Config(crio.ConfigParams{Paths: ps, Pinns: filepath.Join(p.CRIODir, "pinns"), RuntimePath: runtime,
		CNIConfDir: podCNIConf, CNIBinDir: podCNIBin, PauseImage: PauseImage})
	if err != nil {
		return err
	}
	sock := n.Path("fs", crioSocket)
	files := map[string]string{
		filepath.Join(ps.Dir, "crio.conf"):   "# Written by podwire's lab (integration/cluster) for node " + n.Name + ".\n" + cfg,
		ps.SignaturePolicy:                   crio.SignaturePolicy,
		filepath.Join(ps.Dir, "mounts.conf"): "",
		n.crictlConfig():                     fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", sock, sock),
	}
	for file, body := range files {
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			return err
		}
	}
	for _, img := range images {
		if err := p.importImageCRIO(n, img); err != nil {
			return err
		}
	}
	if err := localhostHostPorts(n); err != nil {
		return err
	}
	d, err := s.startDaemon(n.Name+"-crio", n.sysCgroup(), inNode(n, filepath.Join(p.CRIODir, "crio"),
		"--config", filepath.Join(ps.Dir, "crio.conf"), "--config-dir", filepath.Join(ps.Dir, "conf.d")),
		[]string{"PATH=" + sbinPath, "TMPDIR=" + ps.Tmp})
	if err != nil {
		return err
	}
	if err := waitFor(90*time.Second, d, func() error {
		_, err := run(p.Crictl, "--config", n.crictlConfig(), "version")
		return err
	}); err != nil {
		return fmt.Errorf("node %s's CRI-O: %w", n.Name, err)
	}
	return nil
}

// localhostHostPorts is what a CRI-O node needs for hostPorts on 127.0.0.1 (CRI-O's
// own hostPort rules DNAT them, but the kernel drops a DNAT of 127.0.0.1 without
// route_localnet, and the pod would answer 127.0.0.1 to itself without the
// masquerade): docs/crio.md's two commands, in the node's netns (gone with it).
func localhostHostPorts(n Node) error {
	for _, argv := range crio.LocalhostHostPorts {
		if _, err := run(inNode(n, argv...)...); err != nil {
			return fmt.Errorf("node %s (CRI-O, hostPorts on 127.0.0.1): %w", n.Name, err)
		}
	}
	return nil
}

// importImageCRIO copies img into n's CRI-O storage with skopeo, under each of its
// names, inside the node's mount namespace (containers/storage mounts layers there,
// and skopeo's blob-info cache lands in the node's /var/lib/containers bind). CRI-O
// lists what its storage holds: no registry, no pull.
func (p Plan) importImageCRIO(n Node, img ImageArchive) error {
	ps := n.crioPaths()
	store := fmt.Sprintf("containers-storage:[overlay@%s+%s]", ps.Root, ps.RunRoot)
	for i, name := range img.Names {
		src := "oci-archive:" + img.Path
		if i > 0 {
			// The same image again: storage adds the name to the image it has.
			src = store + img.Names[0]
		}
		argv := inNode(n, "skopeo", "--insecure-policy", "--tmpdir", ps.Tmp, "copy", "--quiet", src, store+name)
		if _, err := run(append([]string{"env", "TMPDIR=" + ps.Tmp}, argv...)...); err != nil {
			return fmt.Errorf("node %s: importing %s into CRI-O's storage: %w", n.Name, img.Path, err)
		}
	}
	return nil
}
