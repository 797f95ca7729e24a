// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// The CNI error codes podwire uses. They are the spec's codes (SPEC.md, "Error"),
// re-exported so plugins need not import the cni types package for them.
const (
	CodeIncompatibleVersion = types.ErrIncompatibleCNIVersion      // 1
	CodeUnsupportedField    = types.ErrUnsupportedField            // 2
	CodeUnknownContainer    = types.ErrUnknownContainer            // 3
	CodeInvalidEnv          = types.ErrInvalidEnvironmentVariables // 4
	CodeIOFailure           = types.ErrIOFailure                   // 5
	CodeDecoding            = types.ErrDecodingFailure             // 6
	CodeInvalidConfig       = types.ErrInvalidNetworkConfig        // 7
	CodeTryAgain            = types.ErrTryAgainLater               // 11
	CodeNotAvailable        = types.ErrPluginNotAvailable          // 50
	CodeLimited             = types.ErrLimitedConnectivity         // 51
	CodeInternal            = types.ErrInternal                    // 999
)

// ConfigError is the operator's to fix in the conflist: CNI code 7. key names the
// offending config key (e.g. "ipam.ranges[0][1].gateway").
func ConfigError(key, format string, a ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid "+key, fmt.Sprintf(format, a...))
}

// EnvError reports a bad CNI_* environment variable: CNI code 4.
func EnvError(name, format string, a ...any) error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, "invalid "+name, fmt.Sprintf(format, a...))
}

// DecodeError reports input that is not parseable at all (malformed JSON): CNI code 6.
func DecodeError(what string, err error) error {
	return types.NewError(types.ErrDecodingFailure, "cannot decode "+what, err.Error())
}

// TryAgain marks a transient condition (lock held, xtables busy): code 11, the runtime
// retries.
func TryAgain(what string, err error) error {
	return types.NewError(types.ErrTryAgainLater, what+" is busy; retry", err.Error())
}

// NotAvailable is STATUS's "the plugin cannot serve ADDs now": code 50.
func NotAvailable(format string, a ...any) error {
	return types.NewError(types.ErrPluginNotAvailable, "plugin not available", fmt.Sprintf(format, a...))
}

// LimitedConnectivity is STATUS's "ADDs work but pods may lack connectivity": code 51.
func LimitedConnectivity(format string, a ...any) error {
	return types.NewError(types.ErrLimitedConnectivity, "limited connectivity", fmt.Sprintf(format, a...))
}

// IOError reports a failure to read or write the plugin's own files: code 5.
func IOError(what string, err error) error {
	return types.NewError(types.ErrIOFailure, what, err.Error())
}

// Code returns the CNI code carried by err (through %w wrapping), or CodeInternal when
// err carries none. A nil err has code 0.
func Code(err error) uint {
	if err == nil {
		return 0
	}
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// AsCNIError is the *types.Error a plugin prints for err: what a caller executing the
// plugin would get back (see toCNIError).
func AsCNIError(err error) *types.Error { return toCNIError(err) }

// toCNIError turns any error into the *types.Error printed on stdout. A wrapped
// *types.Error keeps its code; the wrapping context is prefixed to its message so the
// operator sees where it happened.
func toCNIError(err error) *types.Error {
	var e *types.Error
	if errors.As(err, &e) {
		if err.Error() == e.Error() {
			return e
		}
		// err is "context: <e.Error()>"; keep the context in Msg, the details as they were.
		msg := err.Error()
		if e.Details != "" {
			if trimmed, ok := cutSuffix(msg, "; "+e.Details); ok {
				msg = trimmed
			}
		}
		return types.NewError(e.Code, msg, e.Details)
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return s, false
}
