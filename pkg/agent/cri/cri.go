// SPDX-License-Identifier: Apache-2.0

// Package cri is the agent's view of the container runtime over its CRI socket (the
// cri-api gRPC client): the runtime's name and version, and the pod sandboxes it knows.
package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Client talks to one CRI runtime.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient
}

// Dial prepares a client for the unix socket (a path, or unix:///path). The connection
// is made on first use; nothing fails here for a runtime that is not up yet.
func Dial(socket string) (*Client, error) {
	path := strings.TrimPrefix(socket, "unix://")
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return &Client{socket: path, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) wrap(what string, err error) error {
	return fmt.Errorf("CRI %s on %s (is the runtime running, and --cri-socket its socket mounted into the agent?): %w", what, c.socket, err)
}

// Version returns the runtime's RuntimeName and RuntimeVersion.
func (c *Client) Version(ctx context.Context) (name, version string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := c.rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", "", c.wrap("Version", err)
	}
	return v.RuntimeName, v.RuntimeVersion, nil
}

// Sandbox is a pod sandbox the runtime knows, in any state.
type Sandbox struct {
	ID    string
	Ready bool
	Name  string // namespace/name, for logs
}

// Sandboxes lists every pod sandbox the runtime knows, ready or not: a sandbox that is
// not ready still gets its CNI DEL when the kubelet stops it, so its attachment is valid
// until then.
func (c *Client) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, c.wrap("ListPodSandbox", err)
	}
	out := make([]Sandbox, 0, len(r.Items))
	for _, s := range r.Items {
		sb := Sandbox{ID: s.Id, Ready: s.State == runtimeapi.PodSandboxState_SANDBOX_READY}
		if m := s.Metadata; m != nil {
			sb.Name = m.Namespace + "/" + m.Name
		}
		out = append(out, sb)
	}
	return out, nil
}

// Network is one CNI network the runtime attaches every pod sandbox to, as the runtime
// reports it: containerd's own loopback network (cni-loopback, interface lo) and the
// conflists it loaded from its conf dir (at most max_conf_num, 1 by default).
type Network struct {
	Name     string
	IfName   string
	Conflist []byte // the conflist's JSON as the runtime loaded it
}

// Networks returns the CNI networks the runtime attaches pods to, from the "cniconfig"
// entry of its verbose CRI Status (containerd 1.6 to 2.x: go-cni's config). A runtime
// that reports none (CRI-O has no such entry) returns nil and no error: the caller
// then knows only its own network.
func (c *Client) Networks(ctx context.Context) ([]Network, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := c.rt.Status(ctx, &runtimeapi.StatusRequest{Verbose: true})
	if err != nil {
		return nil, c.wrap("Status", err)
	}
	s, ok := r.Info["cniconfig"]
	if !ok {
		return nil, nil
	}
	return ParseCNIConfig(s)
}

// ParseCNIConfig reads go-cni's ConfigResult as containerd prints it in its CRI Status
// info (`crictl info`'s "cniconfig"). go-cni's structs have no JSON tags, so the keys
// are its Go field names; each network's Source is its conflist as loaded.
func ParseCNIConfig(s string) ([]Network, error) {
	var cfg struct {
		Networks []struct {
			Config *struct {
				Name   string
				Source string
			}
			IFName string
		}
	}
	if err := json.Unmarshal([]byte(s), &cfg); err != nil {
		return nil, fmt.Errorf("reading the runtime's CNI networks (CRI Status info \"cniconfig\"): %w", err)
	}
	var out []Network
	for _, n := range cfg.Networks {
		if n.Config == nil || n.Config.Name == "" || n.Config.Source == "" {
			continue
		}
		out = append(out, Network{Name: n.Config.Name, IfName: n.IFName, Conflist: []byte(n.Config.Source)})
	}
	return out, nil
}
