{{/* Names, labels, images and the derived settings every template shares. */}}

{{- define "hami.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "hami.scheduler" -}}{{ include "hami.fullname" . }}-scheduler{{- end -}}
{{- define "hami.webhook" -}}{{ include "hami.fullname" . }}-webhook{{- end -}}
{{- define "hami.devicePlugin" -}}{{ include "hami.fullname" . }}-device-plugin{{- end -}}
{{- define "hami.certgen" -}}{{ include "hami.fullname" . }}-certgen{{- end -}}
{{- define "hami.tlsSecret" -}}{{ include "hami.fullname" . }}-webhook-tls{{- end -}}
{{- define "hami.deviceConfigMap" -}}{{ include "hami.fullname" . }}-scheduler-device{{- end -}}

{{- define "hami.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "hami.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "scheduler"). */}}
{{- define "hami.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* labels/annotations of an object: (dict "root" $ "component" "x" ["labels" map] ["annotations" map]). */}}
{{- define "hami.metadata" -}}
labels:
  {{- include "hami.labels" .root | nindent 2 }}
  {{- if .component }}
  app.kubernetes.io/component: {{ .component }}
  {{- end }}
  {{- with .labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $ann := merge (dict) (.annotations | default dict) (.root.Values.global.annotations | default dict) }}
{{- with $ann }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One image reference: (dict "root" $ "image" .Values.x.image "tag" "override-tag-or-empty").
     global.imageRegistry replaces every registry; an empty tag falls back to global.imageTag, then to
     the chart's appVersion. */}}
{{- define "hami.image" -}}
{{- $registry := .image.registry -}}
{{- if .root.Values.global.imageRegistry -}}{{- $registry = .root.Values.global.imageRegistry -}}{{- end -}}
{{- $tag := .image.tag | default .tag | default .root.Values.global.imageTag | default .root.Chart.AppVersion -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry .image.repository (toString $tag) -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (toString $tag) -}}
{{- end -}}
{{- end -}}

{{- define "hami.pullSecrets" -}}
{{- $secrets := concat (.Values.imagePullSecrets | default list) (.Values.global.imagePullSecrets | default list) -}}
{{- if $secrets }}
imagePullSecrets:
  {{- toYaml $secrets | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The cluster version without provider suffixes: v1.29.11-eks-1234 -> v1.29.11. */}}
{{- define "hami.kubeVersion" -}}
{{- regexFind "v?[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version | default "v1.30.0" -}}
{{- end -}}

{{/* kube-scheduler reads kubescheduler.config.k8s.io/v1 from 1.25 on; 1.23 and 1.24 only know v1beta3
     (v1beta2 too, but v1beta3 is the one kept longest). */}}
{{- define "hami.schedulerConfigApiVersion" -}}
{{- if semverCompare ">=1.25.0-0" (include "hami.kubeVersion" .) -}}
kubescheduler.config.k8s.io/v1
{{- else -}}
kubescheduler.config.k8s.io/v1beta3
{{- end -}}
{{- end -}}

{{- define "hami.leaderElect" -}}
{{- if or .Values.scheduler.leaderElect (gt (int .Values.scheduler.replicas) 1) -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{- define "hami.webhookReplicas" -}}
{{- if gt (int .Values.scheduler.admissionWebhook.replicas) 0 -}}
{{- .Values.scheduler.admissionWebhook.replicas -}}
{{- else -}}
{{- .Values.scheduler.replicas -}}
{{- end -}}
{{- end -}}

{{/* Every resource of every enabled vendor, each once (kube-scheduler refuses duplicate names). NVIDIA's
     and Hygon's come from the resource name values that also go into device-config.yaml; any other
     vendor's from devices.<vendor>.customresources and the resource* names of its deviceConfig.
     Rendered as a JSON list. */}}
{{- define "hami.managedResources" -}}
{{- $names := list -}}
{{- if .Values.devices.nvidia.enabled -}}
{{- $names = concat $names (list .Values.resourceName .Values.resourceMem .Values.resourceMemPercentage .Values.resourceCores .Values.resourcePriority) -}}
{{- end -}}
{{- if .Values.devices.hygon.enabled -}}
{{- $names = concat $names (list .Values.dcuResourceName .Values.dcuResourceMem .Values.dcuResourceCores) -}}
{{- end -}}
{{- range $vendor, $d := .Values.devices -}}
{{- if and (kindIs "map" $d) $d.enabled (ne $vendor "nvidia") (ne $vendor "hygon") -}}
{{- $names = concat $names ($d.customresources | default list) -}}
{{- range $key, $value := ($d.deviceConfig | default dict) -}}
{{- if and (hasPrefix "resource" $key) (kindIs "string" $value) $value -}}
{{- $names = append $names $value -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $names | uniq | toJson -}}
{{- end -}}

{{- define "hami.extenderUrl" -}}
http://127.0.0.1:{{ .Values.scheduler.extender.port }}
{{- end -}}

{{/* Scheduling constraints shared by the Deployments: explicit affinity wins; with more than one
     replica, prefer spreading over nodes. (dict "root" $ "component" "scheduler" "values" .Values.scheduler "replicas" N) */}}
{{- define "hami.affinity" -}}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if gt (int .replicas) 1 }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "hami.selectorLabels" (dict "root" .root "component" .component) | nindent 14 }}
{{- end }}
{{- end -}}

{{/* A list of strings as a CEL list body: 'a', 'b'. */}}
{{- define "hami.celList" -}}
{{- $q := list -}}
{{- range . }}{{ $q = append $q (printf "'%s'" .) }}{{ end -}}
{{- join ", " $q -}}
{{- end -}}

{{/* nodePort of a metrics Service port: (dict "type" .service.type "port" N). HAMi's chart serves these
     Services as NodePort on the port number itself (31993, 31992) and Prometheus setups scrape the nodes
     there, so a NodePort Service whose port lies in the node-port range keeps it as its nodePort; any
     other port is left to the API server to choose. */}}
{{- define "hami.nodePort" -}}
{{- $port := int .port -}}
{{- if and (eq .type "NodePort") (ge $port 30000) (le $port 32767) -}}
nodePort: {{ $port }}
{{- end -}}
{{- end -}}
