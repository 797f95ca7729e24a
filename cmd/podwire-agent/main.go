// SPDX-License-Identifier: Apache-2.0

// Command podwire-agent makes a Kubernetes node network-complete for podwire's plugins:
// it installs them, writes the conflist for the Node's pod CIDRs, keeps host-gw routes
// and the masquerade in sync, drives the chain's GC and reports STATUS and free
// addresses on the Node. See README.md next to this file.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"k8s.io/client-go/kubernetes"

	"github.com/podwire/podwire/pkg/agent"
	"github.com/podwire/podwire/pkg/agent/cri"
	"github.com/podwire/podwire/pkg/agent/gc"
	"github.com/podwire/podwire/pkg/agent/kube"
	"github.com/podwire/podwire/pkg/agent/metrics"
	"github.com/podwire/podwire/pkg/agent/routes"
	"github.com/podwire/podwire/pkg/netfilter"
)

type options struct {
	agent.Config
	kubeconfig, criSocket, clusterCIDR, healthAddr, metricsAddr, logLevel string
	uninstall                                                             bool
}

// env returns $PODWIRE_<NAME> or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("PODWIRE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))); ok {
		return v
	}
	return def
}

func envBool(name string, def bool) bool {
	v := env(name, fmt.Sprint(def))
	return v == "true" || v == "1"
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(env(name, def.String())); err == nil {
		return d
	}
	return def
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("podwire-agent", flag.ContinueOnError)
	str := func(p *string, name, def, usage string) { fs.StringVar(p, name, env(name, def), usage) }
	str(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty = in-cluster config")
	str(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's Node name (default $NODE_NAME, from the downward API)")
	str(&o.SourceBinDir, "source-bin-dir", "/podwire/bin", "plugin binaries shipped in the image")
	str(&o.CNIBinDir, "cni-bin-dir", "/host/opt/cni/bin", "host CNI bin dir to install into")
	str(&o.CNIConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "host CNI conf dir")
	str(&o.ConflistName, "conflist-name", "10-podwire.conflist", "conflist file name")
	str(&o.NetworkName, "network-name", "podwire", "network name in the conflist")
	str(&o.CNIVersion, "cni-version", "auto", "conflist cniVersion: auto (from the CRI runtime's name and version), 1.0.0 or 1.1.0")
	str(&o.criSocket, "cri-socket", cri.DefaultSockets, "CRI runtime socket (unix); a comma-separated list: the first that exists on the node")
	str(&o.CNICacheDir, "cni-cache-dir", "/var/lib/cni", "libcni result cache, as the runtime uses it")
	str(&o.clusterCIDR, "cluster-cidr", "", "comma-separated cluster pod CIDRs; pod traffic leaving them is masqueraded")
	str(&o.StateDir, "state-dir", "/var/lib/podwire-agent", "where the agent records what it installed")
	str(&o.healthAddr, "health-addr", ":9309", "address for /healthz and /readyz; empty disables")
	str(&o.metricsAddr, "metrics-addr", ":9310", "address for /metrics; empty disables")
	str(&o.Bridge, "bridge", "cni0", "bridge name in the conflist")
	str(&o.IPAMDataDir, "ipam-data-dir", "", "host-local's dataDir in the conflist (empty: host-local's default /var/lib/cni/networks)")
	str(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&o.MTU, "mtu", 0, "bridge MTU in the conflist (0: the plugin's default)")
	fs.DurationVar(&o.GCPeriod, "gc-period", envDuration("gc-period", 5*time.Minute), "GC at startup and every period (0 disables)")
	fs.DurationVar(&o.GCGrace, "gc-grace", envDuration("gc-grace", gc.DefaultGrace), "GC keeps attachments whose lease or libcni cache entry is younger than this, whatever the runtime lists (their ADD may still run)")
	fs.DurationVar(&o.StatusPeriod, "status-period", envDuration("status-period", 30*time.Second), "STATUS, free addresses and resync period")
	fs.BoolVar(&o.ReplaceForeign, "replace-foreign", envBool("replace-foreign", false), "replace plugin binaries (and a conflist) the agent did not install; the originals are backed up and restored by --uninstall")
	fs.BoolVar(&o.Routes, "routes", envBool("routes", true), "host-gw routes to other nodes' pod CIDRs")
	fs.BoolVar(&o.Masquerade, "masquerade", envBool("masquerade", true), "masquerade pod traffic leaving --cluster-cidr")
	fs.BoolVar(&o.uninstall, "uninstall", envBool("uninstall", false), "remove exactly what the agent installed (binaries, conflist, routes, masquerade rules) and exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, s := range strings.Split(o.clusterCIDR, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--cluster-cidr %q: %w", s, err)
		}
		o.ClusterCIDRs = append(o.ClusterCIDRs, p.Masked())
	}
	switch o.CNIVersion {
	case "auto", "1.0.0", "1.1.0":
	default:
		return nil, fmt.Errorf("--cni-version %q: use auto, 1.0.0 or 1.1.0", o.CNIVersion)
	}
	if !o.uninstall && o.NodeName == "" {
		return nil, fmt.Errorf("no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "podwire-agent:", err)
		os.Exit(2)
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.logLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options, log *slog.Logger) error {
	nft := netfilter.NewNFTables()
	defer nft.Close()
	d := agent.Deps{
		Routes:  routes.Netlink{},
		Masq:    nft,
		CNI:     libcni.NewCNIConfigWithCacheDir([]string{hostPathOf(o)}, o.CNICacheDir, nil),
		Links:   gc.BridgeLinks(o.Bridge),
		Rules:   gc.NetfilterRules(ctx),
		Metrics: metrics.New(),
		Log:     log,
	}
	if o.uninstall {
		if err := agent.Uninstall(ctx, o.Config, d); err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
		log.Info("uninstalled")
		return nil
	}
	rc, err := kube.Config(o.kubeconfig)
	if err != nil {
		return err
	}
	rc.UserAgent = "podwire-agent"
	if d.Kube, err = kubernetes.NewForConfig(rc); err != nil {
		return err
	}
	sock, err := cri.PickSocket(o.criSocket)
	if err != nil {
		return err
	}
	if sock != "" {
		log.Info("CRI runtime socket", "socket", sock)
		c, err := cri.Dial(sock)
		if err != nil {
			return err
		}
		defer c.Close()
		d.Runtime = c
	}
	a, err := agent.New(o.Config, d)
	if err != nil {
		return err
	}
	if o.healthAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", probe(a.Healthy))
		mux.HandleFunc("/readyz", probe(a.Ready))
		go serve(ctx, log, o.healthAddr, mux)
	}
	if o.metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", d.Metrics.Handler())
		go serve(ctx, log, o.metricsAddr, mux)
	}
	return a.Run(ctx)
}

// hostPathOf is where libcni finds the plugins when the agent runs them (GC, STATUS):
// the bin dir it installed into.
func hostPathOf(o *options) string { return o.CNIBinDir }

func probe(ok func() bool) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if !ok() {
			http.Error(w, "not ok", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

func serve(ctx context.Context, log *slog.Logger, addr string, h http.Handler) {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Error("http server", "addr", addr, "err", err)
	}
}
