// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// The opt-in log. A plugin entry of a conflist with "logFile" set gets one JSON line
// (log/slog's JSON handler) per verb, with the verb, the network, container ID,
// interface, plugin, the timed steps the plugin reported, its result or its error with
// the CNI code, and, at "debug" or "info", one line per decision the plugin reported.
// Nothing goes to stdout, which is the CNI result. A log that cannot be written never
// fails the verb: the plugin says so once on stderr and carries on. The reference
// plugins ignore these keys (they decode into structs without them), so a conflist
// carrying them still works with the reference.

// DefaultLogMaxBytes is where a log file is rotated when logMaxBytes is not set.
const DefaultLogMaxBytes = 10 << 20

// minLogMaxBytes keeps a tiny logMaxBytes from rotating on every line.
const minLogMaxBytes = 4 << 10

// LogConf is a plugin entry's log keys, as read from its network configuration.
type LogConf struct {
	File     string // absolute path; "" means no log
	Level    slog.Level
	MaxBytes int64
	// Problem is what was wrong with the keys, for the one stderr warning; the log is
	// off (File is "") when it is set.
	Problem string
}

// LogKeys is the opt-in log's keys as a plugin's configuration carries them (podwire
// validate reads their names from it).
type LogKeys = rawLogConf

// rawLogConf are the keys as they appear in the configuration. They are json.RawMessage
// so a wrong type is a warning, never a decoding failure of the whole configuration.
type rawLogConf struct {
	LogFile     json.RawMessage `json:"logFile"`
	LogLevel    json.RawMessage `json:"logLevel"`
	LogMaxBytes json.RawMessage `json:"logMaxBytes"`
}

// parseLogConf reads the log keys of r. A mistake in them never fails the verb: the
// log is then off and Problem says why.
func parseLogConf(r rawLogConf) LogConf {
	c := LogConf{Level: slog.LevelInfo, MaxBytes: DefaultLogMaxBytes}
	if isJSONNull(r.LogFile) {
		return c
	}
	off := func(format string, a ...any) LogConf {
		return LogConf{Problem: fmt.Sprintf(format, a...)}
	}
	var file string
	if err := json.Unmarshal(r.LogFile, &file); err != nil {
		return off("logFile is %s, not a string; the log is off: set it to an absolute path", r.LogFile)
	}
	if file == "" {
		return c
	}
	if !filepath.IsAbs(file) || filepath.Clean(file) != file || strings.HasSuffix(file, "/") {
		return off("logFile %q is not a clean absolute path (the plugin's working directory is the runtime's); the log is off: set it to a path such as /var/log/podwire/cni.log", file)
	}
	c.File = file
	if !isJSONNull(r.LogLevel) {
		var lvl string
		if err := json.Unmarshal(r.LogLevel, &lvl); err != nil {
			return off("logLevel is %s, not a string; the log is off: set it to debug, info, warn or error", r.LogLevel)
		}
		switch strings.ToLower(lvl) {
		case "debug":
			c.Level = slog.LevelDebug
		case "info", "":
			c.Level = slog.LevelInfo
		case "warn", "warning":
			c.Level = slog.LevelWarn
		case "error":
			c.Level = slog.LevelError
		default:
			return off("logLevel %q is not one of debug, info, warn, error; the log is off", lvl)
		}
	}
	if !isJSONNull(r.LogMaxBytes) {
		var n int64
		if err := json.Unmarshal(r.LogMaxBytes, &n); err != nil || n < minLogMaxBytes {
			return off("logMaxBytes is %s: it must be a whole number of bytes, at least %d; the log is off", r.LogMaxBytes, minLogMaxBytes)
		}
		c.MaxBytes = n
	}
	return c
}

func isJSONNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// warnOnce prints the first log problem of this process on stderr.
var warnOnce sync.Once

// logStderr is where that warning goes; tests replace it.
var logStderr io.Writer = os.Stderr

func warnLog(plugin, format string, a ...any) {
	warnOnce.Do(func() {
		fmt.Fprintf(logStderr, "%s: log: %s (the verb goes on without it)\n", plugin, fmt.Sprintf(format, a...))
	})
}

// CallLog is one verb's log: the steps and decisions a plugin reports through the
// context its verb gets (Log(ctx)). A nil *CallLog, what Log returns when the network
// has no logFile, does nothing, so plugins call it unconditionally.
type CallLog struct {
	plugin string
	logger *slog.Logger
	w      *logWriter
	start  time.Time

	mu    sync.Mutex
	steps []stepTime
}

type stepTime struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

type logKey struct{}

// Log is the log of the verb ctx belongs to, or nil when there is none.
func Log(ctx context.Context) *CallLog {
	l, _ := ctx.Value(logKey{}).(*CallLog)
	return l
}

// WithLog returns ctx carrying l, for a verb run outside Main (tests, in-process
// delegation keeps the caller's).
func WithLog(ctx context.Context, l *CallLog) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, logKey{}, l)
}

// Step starts a timed step named name; the returned function ends it. Steps appear,
// in the order they ended, in the verb's final line, and each at "debug" as its own
// line.
//
//	defer cniplumb.Log(ctx).Step("create veth")()
func (l *CallLog) Step(name string) func() {
	if l == nil {
		return func() {}
	}
	t0 := time.Now()
	return func() {
		d := time.Since(t0)
		ms := float64(d.Microseconds()) / 1000
		l.mu.Lock()
		l.steps = append(l.steps, stepTime{Name: name, Ms: ms})
		l.mu.Unlock()
		l.logger.Debug("step", "step", name, "ms", ms)
	}
}

// Decision records a choice the plugin made (a backend, an address, a derived burst)
// as a line of its own at "info", with attrs as slog key-value pairs.
func (l *CallLog) Decision(msg string, attrs ...any) {
	if l == nil {
		return
	}
	l.logger.Info(msg, attrs...)
}

// Warn records a problem that did not fail the verb, at "warn".
func (l *CallLog) Warn(msg string, attrs ...any) {
	if l == nil {
		return
	}
	l.logger.Warn(msg, attrs...)
}

// Debug records detail that is only wanted at "debug".
func (l *CallLog) Debug(msg string, attrs ...any) {
	if l == nil {
		return
	}
	l.logger.Debug(msg, attrs...)
}

// newCallLog opens the log of one verb, or returns nil when c has no file.
func newCallLog(plugin string, c LogConf, cmd string, env func(string) string, conf types.PluginConf) *CallLog {
	if c.Problem != "" {
		warnLog(plugin, "%s", c.Problem)
	}
	if c.File == "" {
		return nil
	}
	w := &logWriter{path: c.File, maxBytes: c.MaxBytes, plugin: plugin}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: c.Level})
	attrs := []any{"plugin", plugin, "verb", cmd, "network", conf.Name, "cniVersion", conf.CNIVersion, "pid", os.Getpid()}
	if id := env("CNI_CONTAINERID"); id != "" {
		attrs = append(attrs, "containerID", id)
	}
	if ifn := env("CNI_IFNAME"); ifn != "" {
		attrs = append(attrs, "ifname", ifn)
	}
	if ns := env("CNI_NETNS"); ns != "" {
		attrs = append(attrs, "netns", ns)
	}
	return &CallLog{plugin: plugin, logger: slog.New(h).With(attrs...), w: w, start: time.Now()}
}

// finish writes the verb's final line: INFO when it succeeded, ERROR with the CNI
// code, message and details when it failed.
func (l *CallLog) finish(res types.Result, err error) {
	if l == nil {
		return
	}
	defer l.w.close()
	l.mu.Lock()
	steps := append([]stepTime(nil), l.steps...)
	l.mu.Unlock()
	attrs := []any{"ms", float64(time.Since(l.start).Microseconds()) / 1000, "podwire", Version}
	if len(steps) > 0 {
		attrs = append(attrs, "steps", steps)
	}
	if err != nil {
		e := toCNIError(err)
		attrs = append(attrs, "code", e.Code, "error", e.Msg)
		if e.Details != "" {
			attrs = append(attrs, "details", e.Details)
		}
		l.logger.Error("failed", attrs...)
		return
	}
	if s := resultSummary(res); s != nil {
		attrs = append(attrs, "result", s)
	}
	l.logger.Info("done", attrs...)
}

// resultSummary is what an ADD result says that an operator looks for in a log: the
// interfaces and addresses. Nil when there is no result or it cannot be converted.
func resultSummary(res types.Result) map[string]any {
	if res == nil {
		return nil
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil
	}
	var ifs, ips []string
	for _, i := range r.Interfaces {
		s := i.Name
		if i.Sandbox != "" {
			s += " (pod)"
		}
		ifs = append(ifs, s)
	}
	for _, ip := range r.IPs {
		s := ip.Address.String()
		if ip.Gateway != nil && !ip.Gateway.Equal(net.IP(nil)) {
			s += " via " + ip.Gateway.String()
		}
		ips = append(ips, s)
	}
	return map[string]any{"interfaces": ifs, "ips": ips}
}
