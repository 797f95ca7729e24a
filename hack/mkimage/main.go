// SPDX-License-Identifier: Apache-2.0

// Command mkimage builds podwire-agent's OCI image without a container daemon
// (github.com/google/go-containerregistry): one layer holding the agent at
// /podwire-agent, its init at /podwire-init (the entrypoint: /podwire-init /podwire-agent,
// see cmd/podwire-init) and the plugins under /podwire/bin, written as an OCI image
// layout in a tar archive that `ctr images import` accepts. With -iptables-wrapper, the
// layer also holds the build machine's Debian iptables package (xtables.go): the
// programs GC and the plugins' iptables backend run on an iptables node.
//
//	go run ./hack/mkimage -agent bin/podwire-agent -init bin/podwire-init -plugins bin -iptables-wrapper bin/iptables-wrapper -name docker.io/podwire/podwire-agent:v1 -o podwire-agent.oci.tar
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	agent := flag.String("agent", "bin/podwire-agent", "the agent binary")
	initBin := flag.String("init", "bin/podwire-init", "the init binary, PID 1 of the container (cmd/podwire-init)")
	plugins := flag.String("plugins", "bin", "directory of plugin binaries (every regular file but the agent and the init)")
	name := flag.String("name", "docker.io/podwire/podwire-agent:dev", "image reference recorded in the archive")
	out := flag.String("o", "podwire-agent.oci.tar", "output archive")
	arch := flag.String("arch", runtime.GOARCH, "image architecture")
	wrapper := flag.String("iptables-wrapper", "", "tools/iptables-wrapper's binary: ship Debian's iptables (installed here) behind it; empty: no iptables tools")
	flag.Parse()
	if err := build(*agent, *initBin, *plugins, *wrapper, *name, *out, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}

// epoch keeps the archive reproducible.
var epoch = time.Unix(0, 0).UTC()

func layerTar(agent, initBin, plugins, wrapper string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch})
	}
	file := func(name, src string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	}
	if err := file("podwire-agent", agent); err != nil {
		return nil, fmt.Errorf("the agent binary (run make build first): %w", err)
	}
	if err := file("podwire-init", initBin); err != nil {
		return nil, fmt.Errorf("the init binary (run make build first): %w", err)
	}
	for _, d := range []string{"podwire", "podwire/bin", "tmp"} {
		if err := dir(d); err != nil {
			return nil, err
		}
	}
	ents, err := os.ReadDir(plugins)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == filepath.Base(agent) || e.Name() == filepath.Base(initBin) || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := file("podwire/bin/"+e.Name(), filepath.Join(plugins, e.Name())); err != nil {
			return nil, err
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("no plugin binaries in %s", plugins)
	}
	if wrapper != "" {
		files, err := xtablesFiles()
		if err != nil {
			return nil, err
		}
		if err := writeXtables(tw, files, wrapper); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func build(agent, initBin, plugins, wrapper, name, out, arch string) error {
	lt, err := layerTar(agent, initBin, plugins, wrapper)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(lt)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: epoch}
	// The init is PID 1 and reaps every orphan of what the agent runs; the DaemonSet
	// passes only args, which follow the agent (cmd/podwire-agent/README.md, "PID 1").
	cf.Config.Entrypoint = []string{"/podwire-init", "/podwire-agent"}
	// /usr/sbin: the iptables tools, for the agent and the plugins it runs.
	cf.Config.Env = []string{"PATH=/podwire/bin"}
	if wrapper != "" {
		cf.Config.Env = []string{"PATH=/podwire/bin:/usr/sbin"}
	}
	cf.Config.Labels = map[string]string{"org.opencontainers.image.source": "https://github.com/podwire/podwire"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	tag := name[strings.LastIndex(name, ":")+1:]
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": tag,
	}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		return err
	}
	return tarDir(tmp, out)
}

// tarDir archives the layout directory with sorted names and fixed times.
func tarDir(dir, out string) error {
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		names = append(names, path)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	tw := tar.NewWriter(f)
	for _, path := range names {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h := &tar.Header{Name: rel, Mode: 0o644, ModTime: epoch, Typeflag: tar.TypeReg, Size: fi.Size()}
		if fi.IsDir() {
			h = &tar.Header{Name: rel + "/", Mode: 0o755, ModTime: epoch, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.IsDir() {
			src, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
