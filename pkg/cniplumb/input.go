package cniplumb

import (
	"bytes"
	"encoding/json"
	"fmt"

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
	// ValidAttachments is cni.dev/valid-attachments, for GC.
	ValidAttachments Owners
}

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
	}
	if err := json.Unmarshal(stdin, &in.Conf); err != nil {
		return nil, DecodeError("network configuration", err)
	}
	if in.Conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&in.Conf); err != nil {
			return nil, DecodeError("prevResult", err)
		}
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
// JSON syntax, the presence and support of cniVersion, and the network name.
func preflightConf(stdin []byte, supported []string) error {
	var c struct {
		CNIVersion *string `json:"cniVersion"`
		Name       *string `json:"name"`
		Type       string  `json:"type"`
	}
	if len(bytes.TrimSpace(stdin)) == 0 {
		return DecodeError("network configuration", fmt.Errorf("stdin is empty; the runtime must pass the network configuration as JSON on stdin"))
	}
	if err := json.Unmarshal(stdin, &c); err != nil {
		return DecodeError("network configuration", err)
	}
	if c.CNIVersion == nil || *c.CNIVersion == "" {
		return ConfigError("cniVersion", "cniVersion is missing; set it to one of %v", supported)
	}
	ok := false
	for _, v := range supported {
		if v == *c.CNIVersion {
			ok = true
		}
	}
	if !ok {
		return types.NewError(CodeIncompatibleVersion, "incompatible CNI version",
			fmt.Sprintf("cniVersion %q is not supported; this plugin supports %v", *c.CNIVersion, supported))
	}
	if c.Name == nil {
		return ConfigError("name", "the network name is missing; set \"name\" in the conflist")
	}
	if msg := checkID("network name", *c.Name); msg != "" {
		return ConfigError("name", "%s", msg)
	}
	return nil
}
