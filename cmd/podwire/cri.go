package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// dialCRI connects to a CRI runtime's socket (a path, or unix:///path).
func dialCRI(sock string) (*grpc.ClientConn, error) {
	target := sock
	if !strings.HasPrefix(target, "unix://") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to the CRI socket %s: %w", sock, err)
	}
	return conn, nil
}

// criSandboxes lists the IDs of every pod sandbox the runtime knows, ready or not: a
// sandbox that still exists may be restarted with its network, so its attachments
// are valid (as the runtimes' own GC treats them).
func criSandboxes(ctx context.Context, sock string) ([]string, error) {
	conn, err := dialCRI(sock)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pod sandboxes through %s: %w; is the runtime running, and is that its CRI socket?", sock, err)
	}
	var ids []string
	for _, s := range resp.Items {
		ids = append(ids, s.Id)
	}
	return ids, nil
}

// criVersion asks the runtime for its name and version (the Version RPC).
func criVersion(ctx context.Context, sock string) (name, ver string, err error) {
	conn, err := dialCRI(sock)
	if err != nil {
		return "", "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := runtimeapi.NewRuntimeServiceClient(conn).Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		return "", "", fmt.Errorf("asking %s for its version: %w", sock, err)
	}
	return v.RuntimeName, v.RuntimeVersion, nil
}
