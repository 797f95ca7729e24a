// SPDX-License-Identifier: Apache-2.0

package kubeapi

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// auditPolicy records, at Metadata level, every request made by a ServiceAccount (the
// agents) and nothing else, so the log's size follows the agents' requests, not the
// test's own. A long-running request (a watch) is recorded when it starts.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
`

// Request is one request of the API server's audit log.
type Request struct {
	AuditID   string
	Stage     string
	Verb      string
	Resource  string // objectRef.resource (and /subresource)
	User      string
	Node      string // the token's authentication.kubernetes.io/node-name
	UserAgent string
	Time      time.Time // when the API server received it
}

// Requests reads the audit log: the requests of ServiceAccounts so far, each once (a
// watch's ResponseStarted and ResponseComplete are one request).
func (s *Server) Requests(t testing.TB) []Request {
	t.Helper()
	f, err := os.Open(s.path("audit.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	var out []Request
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e struct {
			AuditID   string `json:"auditID"`
			Stage     string `json:"stage"`
			Verb      string `json:"verb"`
			UserAgent string `json:"userAgent"`
			User      struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			Received time.Time `json:"requestReceivedTimestamp"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || seen[e.AuditID] {
			continue // a line cut by a concurrent write is the last one; next read has it
		}
		seen[e.AuditID] = true
		r := Request{AuditID: e.AuditID, Stage: e.Stage, Verb: e.Verb, User: e.User.Username, UserAgent: e.UserAgent, Time: e.Received}
		if n := e.User.Extra["authentication.kubernetes.io/node-name"]; len(n) > 0 {
			r.Node = n[0]
		}
		if e.ObjectRef != nil {
			r.Resource = e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				r.Resource += "/" + e.ObjectRef.Subresource
			}
		}
		out = append(out, r)
	}
	return out
}
