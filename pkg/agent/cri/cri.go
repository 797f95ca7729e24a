// SPDX-License-Identifier: Apache-2.0

// Package cri is the agent's view of the container runtime over its CRI socket (the
// cri-api gRPC client): the runtime's name and version, and the pod sandboxes it knows.
package cri

import (
	"context"
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
