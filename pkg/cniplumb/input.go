// SPDX-License-Identifier: Apache-2.0

package cniplumb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// Input is everything a verb gets: the CNI_* environment (already validated) and the
// plugin's stdin, with the fields every plugin shares already parsed.
type Input struct {
	Command     string // ADD, DEL, CHECK, GC or STATUS
	ContainerID string
	Netns       string // may be empty or gone for DEL
	IfName      string
	Args        string // raw CNI_ARGS
	Path        string // CNI_PATH, for delegating to IPAM plugins

	// Stdin is the raw network configuration, for the plugin's own Decode.
	Stdin []byte
	// Conf holds cniVersion, name, type, capabilities and ipam.type.
	Conf types.PluginConf
	// PrevResult is the chained plugin's input converted to the 1.x result types, or
	// nil when the configuration carries none.
	PrevResult *current.Result
	// Prev is the same prevResult as parsed at the configuration's cniVersion
	// (types/020 below 0.3.0, types/040 up to 0.4.0, types/100 after), for a plugin
	// that passes it on unchanged, as the reference's chained plugins do: returned from
	// ADD, it is printed exactly as received, where PrevResult would go through a
	// conversion to 1.x and back.
	Prev types.Result
	// ValidAttachments is cni.dev/valid-attachments, for GC.
	ValidAttachments Owners

	// RunDir is where podwire keeps its small per-boot state (DefaultRunDir in Main;
	// a test's own directory in tests).
	RunDir string
	// BuildStamp is the podwire build this binary is (the linker's BuildStamp in
	// Main); "" means a plain `go build`, which runs no other plugin in-process.
	BuildStamp string
}

// Verdicts is the verdict cache in the input's RunDir.
func (in *Input) Verdicts() Verdicts { return Verdicts{Dir: in.RunDir} }

// Owner is the attachment this call is about.
func (in *Input) Owner() Owner {
	return Owner{Network: in.Conf.Name, ContainerID: in.ContainerID, IfName: in.IfName}
}

// Decode unmarshals the network configuration into v (the plugin's own config struct).
// Malformed JSON or a wrong type is a code-6 error naming the field.
func (in *Input) Decode(v any) error {
	dec := json.NewDecoder(bytes.NewReader(in.Stdin))
	if err := dec.Decode(v); err != nil {
		return DecodeError("network configuration", err)
	}
	return nil
}

// RequirePrevResult returns PrevResult, or a code-7 error telling the operator that
// plugin must be chained after one that produces a result.
func (in *Input) RequirePrevResult() (*current.Result, error) {
	if in.PrevResult == nil {
		return nil, ConfigError("prevResult", "%s is a chained plugin: list it after a main plugin (such as bridge) in a conflist so it receives prevResult", in.Conf.Type)
	}
	return in.PrevResult, nil
}

// parseInput fills Input's shared fields from stdin. Errors carry CNI codes.
func parseInput(cmd string, env func(string) string, stdin []byte) (*Input, error) {
	in := &Input{
		Command:     cmd,
		ContainerID: env("CNI_CONTAINERID"),
		Netns:       env("CNI_NETNS"),
		IfName:      env("CNI_IFNAME"),
		Args:        env("CNI_ARGS"),
		Path:        env("CNI_PATH"),
		Stdin:       stdin,
		RunDir:      DefaultRunDir,
		BuildStamp:  BuildStamp,
	}
	if err := json.Unmarshal(stdin, &in.Conf); err != nil {
		return nil, DecodeError("network configuration", err)
	}
	if in.Conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&in.Conf); err != nil {
			return nil, DecodeError("prevResult", err)
		}
		in.Prev = in.Conf.PrevResult
		res, err := current.NewResultFromResult(in.Conf.PrevResult)
		if err != nil {
			return nil, DecodeError("prevResult", fmt.Errorf("converting to CNI 1.x result: %w", err))
		}
		in.PrevResult = res
	}
	if len(in.Conf.ValidAttachments) > 0 {
		in.ValidAttachments = Owners{}
		for _, a := range in.Conf.ValidAttachments {
			in.ValidAttachments[Owner{Network: in.Conf.Name, ContainerID: a.ContainerID, IfName: a.IfName}] = true
		}
	}
	return in, nil
}

// preflightConf checks what skel would otherwise reject with less helpful messages:
// JSON syntax, the support of cniVersion (none at all is 0.1.0, as skel and libcni read
// it), and the network name. It also returns the log keys (logFile, logLevel,
// logMaxBytes), read in the same pass, so a refused verb can be logged too.
func preflightConf(stdin []byte, supported []string) (lc LogConf, err error) {
	var c struct {
		CNIVersion *string `json:"cniVersion"`
		Name       *string `json:"name"`
		Type       string  `json:"type"`
		rawLogConf
	}
	if len(bytes.TrimSpace(stdin)) == 0 {
		return lc, DecodeError("network configuration", fmt.Errorf("stdin is empty; the runtime must pass the network configuration as JSON on stdin"))
	}
	if err := json.Unmarshal(stdin, &c); err != nil {
		return lc, DecodeError("network configuration", err)
	}
	lc = parseLogConf(c.rawLogConf)
	if c.CNIVersion == nil || *c.CNIVersion == "" {
		if !slices.Contains(supported, "0.1.0") {
			return lc, types.NewError(CodeIncompatibleVersion, "incompatible CNI version",
				fmt.Sprintf("the configuration has no cniVersion, which means 0.1.0; this plugin supports %v: set cniVersion to one of them", supported))
		}
	} else if !slices.Contains(supported, *c.CNIVersion) {
		return lc, types.NewError(CodeIncompatibleVersion, "incompatible CNI version",
			fmt.Sprintf("cniVersion %q is not supported; this plugin supports %v", *c.CNIVersion, supported))
	}
	if c.Name == nil {
		return lc, ConfigError("name", "the network name is missing; set \"name\" in the conflist")
	}
	if msg := checkID("network name", *c.Name); msg != "" {
		return lc, ConfigError("name", "%s", msg)
	}
	return lc, nil
}
