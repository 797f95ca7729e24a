// SPDX-License-Identifier: Apache-2.0

package crio

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// PodInspect is the part of `crictl inspectp -o json` the tests read.
type PodInspect struct {
	Status struct {
		ID      string `json:"id"`
		State   string `json:"state"`
		Network struct {
			IP string `json:"ip"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
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

// NetNS returns the pod's network namespace path as CRI-O sees it (in its mount
// namespace), "" when the pod has none of its own.
func (p *PodInspect) NetNS() string {
	for _, n := range p.Info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			return n.Path
		}
	}
	return ""
}

// RunPod writes config as a pod sandbox config file and runs `crictl runp` on it.
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
	if err != nil {
		return "", err
	}
	var id string
	if _, err := fmt.Sscan(out, &id); err != nil {
		return "", fmt.Errorf("crictl runp printed %q: %w", out, err)
	}
	return id, nil
}

// InspectPod runs `crictl inspectp -o json`.
func (d *Daemon) InspectPod(id string) (*PodInspect, error) {
	out, err := d.Crictl("inspectp", "-o", "json", id)
	if err != nil {
		return nil, err
	}
	var p PodInspect
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		return nil, fmt.Errorf("parsing crictl inspectp: %w\n%s", err, out)
	}
	return &p, nil
}
