// SPDX-License-Identifier: Apache-2.0

package cluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/podwire/podwire/integration/containerd"
)

// ImageArchive is an OCI archive to import into every node's containerd and the names it
// must carry there (the first is the one recorded in the archive).
type ImageArchive struct {
	Path  string
	Names []string
}

// agnhostPackages are what agnhost's specs exec beside agnhost itself: sh (dash: busybox's
// sh runs its own applets before PATH, and its nc has no -u), the small tools
// (busybox-static, a static binary), curl, wget (busybox-static's own wget dies of a
// segmentation fault on every request here, and the Services specs poll with it), nc,
// dig, ss and getent (libc-bin: the DNS specs resolve with it). Their dependencies come
// from apt; agnhostSkip are dependencies of maintainer scripts, never run here.
var (
	agnhostPackages = []string{"dash", "busybox-static", "curl", "wget", "bind9-dnsutils", "iproute2", "netcat-openbsd", "libc-bin", "bash"}
	agnhostSkip     = map[string]bool{"debconf": true, "cdebconf": true, "dpkg": true, "install-info": true, "tar": true,
		"libdebian-installer4": true, "libnewt0.52": true, "libslang2": true, "libtextwrap1": true}
)

// agnhostRecipe changes the cache key whenever the way the rootfs is put together does.
const agnhostRecipe = "agnhost-rootfs-8"

// imageCache is where built image archives are kept between runs.
func (p Plan) imageCache() string { return filepath.Join(p.Repo, ".cache", "kube", "images") }

// buildImages builds (or takes from the cache) the pause, agnhost, CoreDNS and
// podwire-agent images. agnhostNames are the names e2e.test expects agnhost under.
func buildImages(p Plan, agnhostNames []string, coredns string) ([]ImageArchive, error) {
	if err := os.MkdirAll(p.imageCache(), 0o755); err != nil {
		return nil, err
	}
	pause, err := goImage(p, "pause", filepath.Join(p.Repo, "integration", "containerd", "pause"), PauseImage)
	if err != nil {
		return nil, err
	}
	agn, err := agnhostImage(p, agnhostNames[0])
	if err != nil {
		return nil, err
	}
	dns, err := fileImage(p, "coredns", coredns, CoreDNSImage)
	if err != nil {
		return nil, err
	}
	// As upstream builds it: the one static binary as its entrypoint.
	regression, err := fileImage(p, "regression-issue-74839", p.bin("regression-issue-74839"), RegressionImage)
	if err != nil {
		return nil, err
	}
	agent, err := agentImage(p)
	if err != nil {
		return nil, err
	}
	return []ImageArchive{pause, {Path: agn, Names: agnhostNames}, dns, regression, agent}, nil
}

// goImage builds a static Go program of podwire's repo into a one-file image.
func goImage(p Plan, name, pkg, ref string) (ImageArchive, error) {
	bin := filepath.Join(p.Dir, "images", name)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Dir = p.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return ImageArchive{}, fmt.Errorf("building %s: %w\n%s", name, err, out)
	}
	return fileImage(p, name, bin, ref)
}

// fileImage packs one static binary as /<name>, its entrypoint.
func fileImage(p Plan, name, bin, ref string) (ImageArchive, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return ImageArchive{}, err
	}
	var buf bytes.Buffer
	img := containerd.Image{Name: ref, Entrypoint: []string{"/" + name}, Files: []containerd.File{{Path: "/" + name, Mode: 0o755, Data: data}}}
	if err := containerd.WriteOCIArchive(&buf, img); err != nil {
		return ImageArchive{}, err
	}
	out := filepath.Join(p.Dir, "images", name+".oci.tar")
	return ImageArchive{Path: out, Names: []string{ref}}, os.WriteFile(out, buf.Bytes(), 0o644)
}

// agnhostImage is a minimal Debian root filesystem (the packages agnhost's specs exec,
// unpacked from apt's .debs, no maintainer scripts) plus agnhost as /agnhost. It is
// cached under .cache/kube/images by a key over the package versions and the binary.
func agnhostImage(p Plan, ref string) (string, error) {
	pkgs, err := debClosure(agnhostPackages)
	if err != nil {
		return "", err
	}
	agnhost, err := os.ReadFile(p.bin("agnhost"))
	if err != nil {
		return "", err
	}
	// agnhost's image carries CoreDNS as /coredns: the DNS configMap specs run it as
	// their upstream nameserver.
	coredns, err := os.ReadFile(p.bin("coredns"))
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintln(h, agnhostRecipe, ref, strings.Join(pkgs, " "))
	h.Write(agnhost)
	h.Write(coredns)
	out := filepath.Join(p.imageCache(), "agnhost-"+hex.EncodeToString(h.Sum(nil))[:16]+".oci.tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(p.imageCache(), 0o755); err != nil {
		return "", err
	}
	work, err := os.MkdirTemp(p.imageCache(), ".agnhost-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	debs := filepath.Join(work, "debs")
	for _, d := range []string{debs, root + "/usr/bin", root + "/usr/sbin", root + "/usr/lib", root + "/etc", root + "/tmp"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	// Debian bookworm's merged /usr: /bin, /sbin, /lib and /lib64 are links into it.
	for _, l := range []string{"bin", "sbin", "lib"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			return "", err
		}
	}
	if err := os.Symlink("usr/lib64", filepath.Join(root, "lib64")); err != nil {
		return "", err
	}
	dl := exec.Command("apt-get", append([]string{"download", "-q"}, pkgs...)...)
	dl.Dir = debs
	if out, err := dl.CombinedOutput(); err != nil {
		return "", fmt.Errorf("apt-get download (run apt-get update first): %w\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	for _, f := range files {
		// --keep-directory-symlink: a package's ./bin/ must land in usr/bin, not replace the link.
		if _, err := run("sh", "-c", `dpkg-deb --fsys-tarfile "$1" | tar -x --keep-directory-symlink -C "$2"`, "sh", f, root); err != nil {
			return "", err
		}
	}
	// update-alternatives (a maintainer script, not run here) would point nc at
	// netcat-openbsd; busybox's nc has no -u.
	if err := os.Symlink("nc.openbsd", filepath.Join(root, "usr", "bin", "nc")); err != nil {
		return "", err
	}
	if err := os.Symlink("dash", filepath.Join(root, "usr", "bin", "sh")); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	// The other small tools (ls, cat, grep, ...) are busybox applets.
	list, err := run(filepath.Join(root, "bin", "busybox"), "--list")
	if err != nil {
		return "", err
	}
	for _, applet := range strings.Fields(list) {
		link := filepath.Join(root, "usr", "bin", applet)
		if _, err := os.Lstat(link); err == nil || applet == "busybox" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, "usr", "sbin", applet)); err == nil {
			continue
		}
		if err := os.Symlink("busybox", link); err != nil {
			return "", err
		}
	}
	// As agnhost's own Dockerfile has it (with CMD ["pause"]: specs run pods that give
	// no arguments and exec into them): the user and group a SupplementalGroups spec
	// expects, porter's test certificate in the working dir, /uploads for netexec and
	// the agnhost-2 link the entrypoint specs run.
	etc := map[string]string{
		"etc/nsswitch.conf": "hosts: files dns\npasswd: files\ngroup: files\n",
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n" +
			"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		"etc/group": "root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n",
	}
	porter, err := kubeSource(p, "test/images/agnhost/porter")
	if err != nil {
		return "", err
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		b, err := os.ReadFile(filepath.Join(porter, f))
		if err != nil {
			return "", fmt.Errorf("agnhost's porter certificate: %w", err)
		}
		etc[f] = string(b)
	}
	if err := os.MkdirAll(filepath.Join(root, "uploads"), 0o777); err != nil {
		return "", err
	}
	if err := os.Symlink("agnhost", filepath.Join(root, "agnhost-2")); err != nil {
		return "", err
	}
	for name, body := range etc {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(root, "agnhost"), agnhost, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "coredns"), coredns, 0o755); err != nil {
		return "", err
	}
	// Documentation and glibc's charset converters (8 MB) are never used by these tools.
	shared, _ := os.ReadDir(filepath.Join(root, "usr", "share"))
	for _, e := range shared {
		if e.Name() != "iproute2" {
			_ = os.RemoveAll(filepath.Join(root, "usr", "share", e.Name()))
		}
	}
	gconv, _ := filepath.Glob(filepath.Join(root, "usr", "lib", "*", "gconv"))
	for _, g := range gconv {
		_ = os.RemoveAll(g)
	}
	layer, err := tarDir(root)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	if err := containerd.WriteOCIArchive(&buf, containerd.Image{Name: ref, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Layer: layer}); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	// Older builds (another agnhost or package version) are never used again.
	old, _ := filepath.Glob(filepath.Join(p.imageCache(), "agnhost-*.oci.tar"))
	for _, o := range old {
		_ = os.Remove(o)
	}
	return out, os.Rename(tmp, out)
}

// debClosure is pkgs and their dependencies (no recommends), as name=version.
func debClosure(pkgs []string) ([]string, error) {
	out, err := run(append([]string{"apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances"}, pkgs...)...)
	if err != nil {
		return nil, fmt.Errorf("resolving agnhost's packages (apt-get update; apt-get install apt): %w", err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if line == "" || strings.HasPrefix(line, " ") || strings.HasPrefix(line, "<") || agnhostSkip[line] {
			continue
		}
		seen[line] = true
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	// One apt-cache call: per package a "name:" line, then its "  Candidate: v" line.
	pol, err := run(append([]string{"apt-cache", "policy"}, names...)...)
	if err != nil {
		return nil, err
	}
	cand := map[string]string{}
	cur := ""
	for _, l := range strings.Split(pol, "\n") {
		if !strings.HasPrefix(l, " ") && strings.HasSuffix(l, ":") {
			cur = strings.TrimSuffix(l, ":")
		} else if f := strings.Fields(l); len(f) == 2 && f[0] == "Candidate:" && cur != "" {
			cand[cur] = f[1]
		}
	}
	var pinned []string
	for _, n := range names {
		if v := cand[n]; v == "" || v == "(none)" {
			return nil, fmt.Errorf("apt has no candidate for %s (agnhost's image): run apt-get update", n)
		}
		pinned = append(pinned, n+"="+cand[n])
	}
	return pinned, nil
}

// tarDir packs root as an uncompressed, reproducible layer: sorted, owned by root, fixed
// times; symlinks kept as links.
func tarDir(root string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("packing %s: %w", root, err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// agentImage runs `make image` from the checkout, named as deploy/ names it.
func agentImage(p Plan) (ImageArchive, error) {
	out := filepath.Join(p.Dir, "images", "podwire-agent.oci.tar")
	cmd := exec.Command("make", "--no-print-directory", "image", "IMAGE_NAME="+AgentImage, "IMAGE_TAR="+out,
		"DIST_DIR="+filepath.Join(p.Dir, "images", "dist"))
	cmd.Dir = p.Repo
	if b, err := cmd.CombinedOutput(); err != nil {
		return ImageArchive{}, fmt.Errorf("make image: %w\n%s", err, b)
	}
	return ImageArchive{Path: out, Names: []string{AgentImage}}, nil
}

// importImage imports img into n's containerd (the CRI plugin's namespace) and tags it
// with every further name.
func (p Plan) importImage(n Node, img ImageArchive) error {
	ctr := func(args ...string) error {
		_, err := run(inNode(n, append([]string{filepath.Join(p.ContainerdDir, "ctr"), "--address", criSocket, "--namespace", "k8s.io"}, args...)...)...)
		return err
	}
	if err := ctr("images", "import", img.Path); err != nil {
		return fmt.Errorf("node %s: importing %s: %w", n.Name, img.Path, err)
	}
	for _, name := range img.Names[1:] {
		_ = ctr("images", "rm", name)
		if err := ctr("images", "tag", img.Names[0], name); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// kubeSource is a directory of k8s.io/kubernetes's source at the pinned version, from the
// module cache (the wrapper module that builds the binaries has it).
func kubeSource(p Plan, rel string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(p.Repo, "integration", "kubeapi", "build", "kubernetes")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return "", fmt.Errorf("locating k8s.io/kubernetes's source (go mod download in %s): %v", cmd.Dir, err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), rel), nil
}
