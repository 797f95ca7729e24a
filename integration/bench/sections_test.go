package bench

import "fmt"

// A section is one group of rows in BENCHMARKS.md. quick sections also run in
// `make bench-quick`.
type section struct {
	name  string
	quick bool
	run   func(e *env)
}

var sections = []section{
	{"Full chain, sequential", true, benchChain},
	{"Each plugin alone", true, benchAlone},
}

const chainConf = `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
 {"type":"bridge","bridge":"cnibench0","isGateway":true,"ipMasq":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]],"dataDir":"@DATADIR@"}},
 {"type":"portmap","capabilities":{"portMappings":true}},
 {"type":"bandwidth","capabilities":{"bandwidth":true}}]}`

// containerdBurst is what containerd and CRI-O pass as burst for every annotated pod.
const containerdBurst = 4294967295

func chainCaps(i int) map[string]any {
	return map[string]any{
		"portMappings": []map[string]any{{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth": map[string]any{"ingressRate": 10_000_000, "ingressBurst": containerdBurst,
			"egressRate": 10_000_000, "egressBurst": containerdBurst},
	}
}

func benchChain(e *env) {
	e.timed("bridge(ipMasq)+host-local, portmap (1 mapping), bandwidth", chainConf, "eth0", chainCaps,
		"bridge", "host-local", "portmap", "bandwidth")
}

func benchAlone(e *env) {
	e.timed("loopback", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[{"type":"loopback"}]}`, "lo", nil, "loopback")
	e.timed("host-local", `{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
		{"type":"host-local","ipam":{"type":"host-local","ranges":[[{"subnet":"10.89.0.0/16"}]],"dataDir":"@DATADIR@"}}]}`, "eth0", nil, "host-local")
	e.timed("bridge(ipMasq)+host-local", fmt.Sprintf(`{"cniVersion":"1.1.0","name":"@NAME@","plugins":[
		{"type":"bridge","bridge":"cnibench1","isGateway":true,"ipMasq":true,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":"10.90.0.0/16"}]],"dataDir":"%s"}}]}`, "@DATADIR@"),
		"eth0", nil, "bridge", "host-local")
}
