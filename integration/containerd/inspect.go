// SPDX-License-Identifier: Apache-2.0

package containerd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PodInspect is the part of `crictl inspectp -o json` the test reads.
type PodInspect struct {
	Status struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Network struct {
			IP            string `json:"ip"`
			AdditionalIPs []struct {
				IP string `json:"ip"`
			} `json:"additionalIps"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

// NetNSPath is the pod's network namespace file, as containerd mounted it.
func (p *PodInspect) NetNSPath() string {
	for _, n := range p.Info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			return n.Path
		}
	}
	return ""
}

// RunPod writes a PodSandboxConfig (JSON) and runs `crictl runp` on it.
func (d *Daemon) RunPod(name string, config any) (string, error) {
	b, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(d.Dir, name+"-pod.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", err
	}
	out, err := d.Crictl("runp", path)
	return strings.TrimSpace(out), err
}

// InspectPod runs `crictl inspectp -o json`.
func (d *Daemon) InspectPod(id string) (*PodInspect, error) {
	out, err := d.Crictl("inspectp", "-o", "json", id)
	if err != nil {
		return nil, err
	}
	var p PodInspect
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("parsing crictl inspectp output: %w\n%s", err, out)
	}
	return &p, nil
}

// Mounts lists the mount points under d.Dir in containerd's mount namespace.
func (d *Daemon) Mounts() ([]string, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", d.Pid()))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], d.Dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// Cgroups lists the cgroup directories below CgroupParent, in every hierarchy.
func (d *Daemon) Cgroups() []string { return d.cgroupDirs(false) }

// cgroupDirs lists, parents before children, the directories below CgroupParent in
// every hierarchy, and CgroupParent itself when withParent.
func (d *Daemon) cgroupDirs(withParent bool) []string {
	var out []string
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.CgroupParent))
	for _, p := range parents {
		_ = filepath.WalkDir(p, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && (withParent || path != p) {
				out = append(out, path)
			}
			return nil
		})
	}
	return out
}
