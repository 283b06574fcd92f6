{{/*
Names and labels, after Helm's conventions:
https://helm.sh/docs/chart_best_practices/labels/ (app.kubernetes.io/* and helm.sh/chart).
*/}}

{{- define "fracspawner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fracspawner.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's resource name: fracspawner.component (dict "root" $ "component" "service") */}}
{{- define "fracspawner.componentName" -}}
{{- printf "%s-%s" (include "fracspawner.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Cluster-scoped objects also carry the namespace: two releases of one name must not clash. */}}
{{- define "fracspawner.clusterName" -}}
{{- printf "%s-%s-%s" .root.Release.Namespace (include "fracspawner.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fracspawner.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fracspawner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fracspawner.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fracspawner.labels" -}}
helm.sh/chart: {{ include "fracspawner.chart" .root }}
{{ include "fracspawner.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: fracspawner
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Object metadata of a namespaced object: name, namespace, labels. */}}
{{- define "fracspawner.metadata" -}}
name: {{ include "fracspawner.componentName" . }}
namespace: {{ .root.Release.Namespace }}
labels:
  {{- include "fracspawner.labels" . | nindent 2 }}
{{- end }}

{{/* image: {name, tag, digest, pullPolicy}, z2jh's shape (hub.image, singleuser.image) */}}
{{- define "fracspawner.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.name $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.name (default .Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{/* The hub API URL: jupyterhub.apiUrl, or z2jh's hub Service under hub.baseUrl (z2jh's
own culler calls http://localhost:8081 + base_url + hub/api). */}}
{{- define "fracspawner.hubApiUrl" -}}
{{- if .Values.jupyterhub.apiUrl }}
{{- .Values.jupyterhub.apiUrl }}
{{- else }}
{{- printf "http://hub:8081%shub/api" (.Values.jupyterhub.baseUrl | trimSuffix "/" | printf "%s/") }}
{{- end }}
{{- end }}

{{/* extraEnv as z2jh takes it: a list of EnvVars, or a map of name -> value (a string, or
an EnvVar's other fields such as valueFrom). Renders a YAML list, or nothing. */}}
{{- define "fracspawner.extraEnv" -}}
{{- $out := list }}
{{- if kindIs "map" . }}
{{- range $name, $value := . }}
{{- if kindIs "map" $value }}
{{- $out = append $out (merge (dict "name" $name) $value) }}
{{- else }}
{{- $out = append $out (dict "name" $name "value" (toString $value)) }}
{{- end }}
{{- end }}
{{- else }}
{{- $out = . }}
{{- end }}
{{- with $out }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* (dict "root" $ "component" "webhook"), plus "valuesKey" "kubeflowCuller" where the values key
differs from the component's name */}}
{{- define "fracspawner.serviceAccountName" -}}
{{- $sa := index .root.Values (default .component .valuesKey) "serviceAccount" }}
{{- if $sa.create }}
{{- default (include "fracspawner.componentName" .) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{- define "fracspawner.catalogConfigMap" -}}
{{- include "fracspawner.componentName" (dict "root" . "component" "catalog") }}
{{- end }}

{{/* The catalog volume and its mount, shared by every workload. */}}
{{- define "fracspawner.catalogVolume" -}}
- name: catalog
  configMap:
    name: {{ include "fracspawner.catalogConfigMap" . }}
{{- end }}

{{- define "fracspawner.catalogMount" -}}
- name: catalog
  mountPath: /etc/fracspawner
  readOnly: true
{{- end }}

{{/* The catalog: the values' one, or the chart's default when the values give none. */}}
{{- define "fracspawner.catalog" -}}
{{- if .Values.catalog }}
{{- toYaml .Values.catalog }}
{{- else }}
{{- .Files.Get "files/default-catalog.yaml" }}
{{- end }}
{{- end }}

{{- define "fracspawner.catalogPath" -}}
/etc/fracspawner/catalog.yaml
{{- end }}

{{/* The env entry JUPYTERHUB_API_TOKEN of a hub service: (dict "root" $ "values" .Values.culler),
or another name for it: (dict "root" $ "values" .Values.service "env" "FRACSPAWNER_SERVICE_API_TOKEN") */}}
{{- define "fracspawner.apiTokenEnv" -}}
- name: {{ default "JUPYTERHUB_API_TOKEN" .env }}
  valueFrom:
    secretKeyRef:
      name: {{ default .root.Values.jupyterhub.tokenSecret .values.apiToken.secretName }}
      key: {{ default (printf "hub.services.%s.apiToken" .values.name) .values.apiToken.secretKey }}
{{- end }}

{{/*
Pod-level settings shared by every workload: security context, scheduling, pull secrets.
(dict "root" $ "values" .Values.service)
*/}}
{{- define "fracspawner.podSpecCommon" -}}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  {{- if kindIs "string" . }}
  - name: {{ . | quote }}
  {{- else }}
  - name: {{ .name | quote }}
  {{- end }}
  {{- end }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with concat (.root.Values.scheduling.corePods.tolerations | default list) (.values.tolerations | default list) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Container settings shared by every workload: image, security context, resources. */}}
{{- define "fracspawner.containerCommon" -}}
image: {{ include "fracspawner.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
securityContext:
  {{- toYaml .root.Values.containerSecurityContext | nindent 2 }}
resources:
  {{- toYaml .values.resources | nindent 2 }}
{{- end }}

{{/* A writable /tmp on a read-only root filesystem. */}}
{{- define "fracspawner.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{- define "fracspawner.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
The label value fracspawner.io/gpu of an offer, as fracspawner.model.slices.Slice.label computes
it ("1/4" -> "0.25", "10GiB" -> "10Gi", "1g.10gb" -> "mig-1g.10gb", "2" -> "2"). The chart
tests check it against the product's own function for every offer of every example catalog.
*/}}
{{- define "fracspawner.offerLabel" -}}
{{- $t := toString . | trim | lower -}}
{{- if regexMatch "^[0-9]{1,3}$" $t -}}
{{- atoi $t -}}
{{- else if regexMatch "^[0-9]{1,3}\\s*/\\s*[0-9]{1,3}$" $t -}}
{{- $parts := regexSplit "\\s*/\\s*" $t -1 -}}
{{- $n := atoi (index $parts 0) -}}
{{- $d := atoi (index $parts 1) -}}
{{- if eq (mod $n $d) 0 -}}
{{- div $n $d -}}
{{- else -}}
{{- regexReplaceAll "0+$" (printf "%.6f" (divf $n $d)) "" | trimSuffix "." -}}
{{- end -}}
{{- else if regexMatch "^[0-9]{0,3}\\.[0-9]{1,6}$" $t -}}
{{- $f := float64 $t -}}
{{- if eq $f (floor $f) -}}
{{- int64 $f -}}
{{- else -}}
{{- regexReplaceAll "0+$" (printf "%.6f" $f) "" | trimSuffix "." -}}
{{- end -}}
{{- else if regexMatch "^(mig-)?[1-7]g\\.[1-9][0-9]{0,3}gb([+.]me)?$" $t -}}
{{- printf "mig-%s" ($t | trimPrefix "mig-" | replace "+" ".") -}}
{{- else if regexMatch "^[0-9]{1,7}(\\.[0-9]{1,4})?\\s*(gib|gi|gb|g|mib|mi|mb|m)$" $t -}}
{{- $amount := regexFind "^[0-9.]+" $t | float64 -}}
{{- $unit := regexFind "[a-z]+$" $t -}}
{{- $mib := $amount -}}
{{- if hasPrefix "g" $unit }}{{ $mib = mulf $amount 1024 }}{{ end -}}
{{- $mib = int64 $mib -}}
{{- if eq (mod $mib 1024) 0 -}}
{{- printf "%dGi" (div $mib 1024) -}}
{{- else -}}
{{- printf "%dMi" $mib -}}
{{- end -}}
{{- else -}}
{{- fail (printf "catalog offer %q: not a GPU slice the chart can label (see docs/catalog.md)" $t) -}}
{{- end -}}
{{- end }}

{{/* NetworkPolicy egress rules shared by the workloads. */}}
{{- define "fracspawner.netpol.dnsEgress" -}}
{{- if or .dnsPortsKubeSystemNamespace .dnsPortsCloudMetadataServer .dnsPortsPrivateIPs }}
# DNS, where z2jh's policies allow it (networkPolicy.dns; z2jh's
# jupyterhub/templates/_helpers-netpol.tpl, egressAllowRules.dnsPorts*)
- to:
    {{- if .dnsPortsKubeSystemNamespace }}
    - namespaceSelector:
        {{- toYaml .namespaceSelector | nindent 8 }}
    {{- end }}
    {{- if .dnsPortsCloudMetadataServer }}
    # the cloud metadata server (GKE Cloud DNS)
    - ipBlock:
        cidr: {{ .cloudMetadataIp }}/32
    {{- end }}
    {{- if .dnsPortsPrivateIPs }}
    # private addresses (node-local DNS caches, a DNS Service's address)
    - ipBlock:
        cidr: 10.0.0.0/8
    - ipBlock:
        cidr: 172.16.0.0/12
    - ipBlock:
        cidr: 192.168.0.0/16
    {{- end }}
  ports:
    {{- range .ports }}
    - {port: {{ . }}, protocol: UDP}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- end }}
{{- end }}
{{- /*
Where the Kubernetes API server is, as JSON {cidrs, ports, found}: networkPolicy.kubeApi.cidrs
when set; else (the default, []) what the cluster says at install/upgrade: the `kubernetes`
Service's cluster IPs and its EndpointSlice's addresses (the API servers themselves; a CNI may
see either, before or after the Service's address translation), one /32 (/128) each, at the
Service's and the endpoints' ports. `helm template` and --dry-run cannot look (lookup answers
nothing): then 0.0.0.0/0 at networkPolicy.kubeApi.ports, and NOTES says how to narrow it.
*/}}
{{- define "fracspawner.kubeApi" -}}
{{- $cidrs := list }}
{{- $ports := list }}
{{- $found := false }}
{{- if .cidrs }}
{{- $cidrs = .cidrs }}
{{- $ports = .ports }}
{{- else }}
{{- $svc := lookup "v1" "Service" "default" "kubernetes" }}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" }}
{{- $ips := list }}
{{- if $svc }}
{{- $ips = concat $ips ($svc.spec.clusterIPs | default (list $svc.spec.clusterIP)) }}
{{- range $svc.spec.ports }}{{ $ports = append $ports .port }}{{ end }}
{{- end }}
{{- if $slice }}
{{- range $slice.endpoints }}{{ $ips = concat $ips .addresses }}{{ end }}
{{- range $slice.ports }}{{ $ports = append $ports .port }}{{ end }}
{{- end }}
{{- range $ip := $ips | uniq }}
{{- if $ip }}
{{- $cidrs = append $cidrs (printf "%s/%s" $ip (ternary "128" "32" (contains ":" $ip))) }}
{{- end }}
{{- end }}
{{- if $cidrs }}
{{- $found = true }}
{{- $ports = $ports | uniq }}
{{- else }}
{{- $cidrs = list "0.0.0.0/0" }}
{{- $ports = .ports }}
{{- end }}
{{- end }}
{{- dict "cidrs" $cidrs "ports" $ports "found" (or $found (not (empty .cidrs))) | toJson }}
{{- end }}

{{- define "fracspawner.netpol.kubeApiEgress" -}}
{{- $api := include "fracspawner.kubeApi" . | fromJson }}
- to:
    {{- range $api.cidrs }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  ports:
    {{- range $api.ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
{{- end }}
